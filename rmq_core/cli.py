"""`rmq` command line: namesrv, broker, standalone, admin."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rmq", description="RocketMQ-compatible broker for Python")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("standalone", help="name server + broker in one process")
    args = parser.parse_args(argv)
    print(f"rmq {args.command}: not built yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
