"""Benchmark harness (`python -m taskdsl.bench ...`) and its timing helpers."""
from .timing import time_cpu
