"""`python -m models ...`: see models.cli."""
import sys

from .cli import main

sys.exit(main())
