"""Command lines whose reader stops reading (`python -m models run resnet50 | head -3`): no traceback."""
from __future__ import annotations

import os
import sys

SIGPIPE_STATUS = 141        # 128 + SIGPIPE: what a shell reports for `cat` stopped the same way


def exit_with(main) -> None:
    """`sys.exit(main())`, where a reader that closed stdout ends the command quietly with SIGPIPE_STATUS (stdout
    then goes to /dev/null, so that Python's own flush at exit does not raise again)."""
    try:
        status = main()
        sys.stdout.flush()      # inside the try: buffered output meets the closed pipe here, not at exit
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = SIGPIPE_STATUS
    sys.exit(status)
