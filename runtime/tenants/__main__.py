"""``python -m tritonforge.runtime.tenants hash-key``: the hash to store in the tenants file for a
key read from stdin (never from the command line: it would stay in the shell's history), or a
fresh random key and its hash with ``--new``."""

from __future__ import annotations

import argparse
import secrets
import sys

from tritonforge.runtime.tenants.keys import hash_key


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tritonforge tenants", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("hash-key", help="print sha256:<hex> of the key on stdin")
    cmd.add_argument("--new", action="store_true", help="make a random key; print it and its hash")
    args = p.parse_args(argv)
    if args.new:
        key = secrets.token_urlsafe(32)
        print(f"key:  {key}\nhash: {hash_key(key)}")
        return 0
    key = sys.stdin.readline().strip()
    if not key:
        print("no key on stdin", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
