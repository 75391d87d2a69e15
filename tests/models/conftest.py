"""Model-zoo tests run the templates' default schedules: tuning every new shape would compile dozens of
candidate kernels per layer on the cpu target."""
import pytest


@pytest.fixture(autouse=True)
def _no_tuning(monkeypatch):
    monkeypatch.setenv("TASKDSL_TUNE", "0")
