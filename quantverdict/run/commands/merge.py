"""``quantverdict merge``: combine shard records (run --shard i/n) into one run record."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from quantverdict.cache import atomic_write_bytes

HELP = 'combine shard records (run --shard i/n) into one run record'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shards", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)


def run(args: argparse.Namespace) -> int:
    from quantverdict.report.load import load_record
    from quantverdict.report.merge import merge_records
    from quantverdict.report.record import check_writable

    check_writable(args.out.parent, "the merged record")

    merged = merge_records([load_record(path) for path in args.shards], [str(p) for p in args.shards])
    atomic_write_bytes(args.out, json.dumps(merged, indent=1, default=str).encode())
    summary = ", ".join(f"{count} {status}" for status, count in sorted(merged["summary"].items()))
    print(f"merged {len(args.shards)} shard(s): {len(merged['cases'])} cases ({summary}) → {args.out}")
    return 0
