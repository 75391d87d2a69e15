"""`python -m models ...`: see models.cli."""
from taskdsl.runtime.pipes import exit_with

from .cli import main

exit_with(main)
