"""``quantverdict prune-cache``: remove the artifacts used least recently: those unused for  --unused-days, then more down to --max-size."""
from __future__ import annotations

import argparse

from quantverdict.errors import HarnessError
from quantverdict.run.commands import common
from quantverdict.run.settings import add_options

HELP = 'remove the artifacts used least recently: those unused for  --unused-days, then more down to --max-size'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-size", type=common.size, help="what the cache may keep, e.g. 20G, 500M (bytes without a unit)")
    parser.add_argument("--unused-days", type=float, help="remove every artifact unused for this many days")
    add_options(parser.add_argument, ("cache-dir",))


def run(args: argparse.Namespace) -> int:
    from quantverdict.cache import Cache

    if args.max_size is None and args.unused_days is None:
        raise HarnessError("prune-cache needs --max-size, --unused-days or both")
    cache_dir = common.settings(args)["cache-dir"]
    result = Cache(cache_dir).prune(args.max_size, None if args.unused_days is None else args.unused_days * 86400)
    print(f"{cache_dir}: removed {result.removed} artifacts ({result.freed_bytes / 2 ** 30:.2f} GiB), "
          f"kept {result.kept} ({result.kept_bytes / 2 ** 30:.2f} GiB)")
    return 0

