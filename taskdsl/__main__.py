"""`python -m taskdsl cache {info,clear}`: inspect or empty the compile cache."""
from __future__ import annotations

import argparse
import sys

from .errors import ConfigError
from .runtime import cache
from .runtime.pipes import exit_with


def main(argv=None) -> int:
    """Run the taskdsl command line (only `cache` for now); return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m taskdsl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cache_cmd = sub.add_parser("cache", help="the on-disk compile cache ($TASKDSL_CACHE_DIR)",
                               description="The on-disk compile cache: the folder $TASKDSL_CACHE_DIR names (default "
                                           "~/.cache/taskdsl), capped at $TASKDSL_CACHE_MAX_MB megabytes (default "
                                           "2048; the least recently used entries go first).")
    cache_cmd.add_argument("action", choices=["info", "clear"])
    args = parser.parse_args(argv)
    try:
        return _cache_command(args.action)
    except BrokenPipeError:         # the reader is gone: `exit_with` ends quietly
        raise
    except ConfigError as e:        # a TASKDSL_* setting: a usage error, as the other command lines report it
        print(f"python -m taskdsl: error: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"python -m taskdsl: error: {e}", file=sys.stderr)
        return 1


def _cache_command(action: str) -> int:
    if action == "info":
        summary = cache.info()
        cap = summary["max_bytes"] / 2**20
        print(f"cache: {summary['path']} (cap {cap:.{0 if cap >= 16 else 2}f} MiB, $TASKDSL_CACHE_MAX_MB)")
        if not summary["kinds"]:
            print("  empty")
        for kind, stats in sorted(summary["kinds"].items()):
            print(f"  {kind}: {stats['entries']} entries, {stats['bytes'] / 2**20:.1f} MiB")
    else:
        print(f"removed {cache.clear()} entries from {cache.info()['path']}")
    return 0


if __name__ == "__main__":
    exit_with(main)
