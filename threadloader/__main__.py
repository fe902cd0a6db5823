"""Command line: ``python -m threadloader bench [...]`` and ``--version``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from threadloader import __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m threadloader``.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The process exit code (argparse exits with 2 on a bad flag).
    """
    from threadloader import bench

    parser = argparse.ArgumentParser(prog="python -m threadloader", description="threadloader tools")
    parser.add_argument("--version", action="version", version=f"threadloader {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench.add_arguments(
        sub.add_parser(
            "bench",
            help="DataLoader vs ThreadDataLoader throughput comparison",
            description=bench.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    status, _ = bench.run_cli(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
