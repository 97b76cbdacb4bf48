"""``quantverdict lock``: search the recipes of ``recipe: auto`` once and write them into the lock file, to commit.

Entries already locked are kept (a lock is re-resolved on purpose, as ``uv lock`` keeps what it resolved): ``--update
MODEL`` (or ``--update all``) searches those again. ``--check`` is the nightly job's: every locked recipe searched again
with its settings judged beside the candidates; where a candidate beats the lock by the search's own paired test, the
proposed lock is written beside the old one (``<lock>.proposed``) and the exit code is 3, for a job to open a pull
request with. Exit 0: the lock holds (or was written); 1: a search could not be locked; 2: bad input.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from quantverdict.run.commands import common
from quantverdict.run.settings import add_options

if TYPE_CHECKING:
    from quantverdict.precision.settings import RecipeSettings
    from quantverdict.tune.result import SearchResult
    from quantverdict.tune.resolve import Resolver

HELP = ("search the recipes of recipe: auto and write them into the lock file (to commit); --update MODEL re-searches, "
        "--check proposes a better recipe beside the lock (exit 3)")
PROPOSED = 3
SEARCHED = ("int8", "fp8")  # the precisions whose recipes a search chooses


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser.add_argument, ("manifest", "models", "precisions", "lock", "tolerances", "cache-dir"))
    parser.add_argument("--update", action="append", metavar="MODEL", default=[],
                        help="search MODEL's recipes again and lock what the search chooses ('all': every model)")
    parser.add_argument("--check", action="store_true",
                        help="search every locked recipe again, the locked settings judged beside the candidates; a "
                             "significantly better one is written to <lock>.proposed and the exit code is 3")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from quantverdict.errors import HarnessError
    from quantverdict.precision import known_precisions
    from quantverdict.run.pipeline import Pipeline
    from quantverdict.tune.decide import decided_before_calibration

    settings = common.settings(args)
    path: Path = settings["lock"]
    update = ["all"] if args.check else args.update
    pipeline = Pipeline(settings["cache-dir"], settings["tolerances"], settings["manifest"], lock=path, relock=update,
                        progress=lambda line: tqdm.write(line, file=sys.stderr), check=args.check)
    assert pipeline.lock is not None
    recipes, lock = pipeline.recipes, pipeline.lock
    cases = pipeline.cases(settings["models"], settings["precisions"])  # names checked: a typo is exit 2
    for model in sorted(set(lock.recipes) - set(pipeline.models.names())):
        print(f"{model}: locked, but no model of that name is declared or registered: its entry is kept (remove it "
              "from the lock if the model is gone)")
    names = list(dict.fromkeys(case.model for case in cases))
    precisions = [p for p in settings["precisions"] or known_precisions() if p in SEARCHED]
    if not precisions:
        searched = " and ".join(precision.upper() for precision in SEARCHED)
        print(f"nothing to lock: a search chooses {searched} recipes only, and --precisions names "
              f"{', '.join(settings['precisions'])}")
        return 0
    wanted = [(model, precision) for model in names for precision in precisions if recipes.auto(model, precision)]
    if not wanted:
        print(f"nothing to lock: no model of {', '.join(names)} searches its {'/'.join(precisions)} recipe "
              "(recipe: auto, a manifest model's default)")
        return 0
    failed, proposed = 0, []
    for model, precision in wanted:
        kept = lock.get(model, precision)
        if kept is not None and recipes.locked(model, precision) is not None:
            print(f"{model} {precision}: locked {_words(kept.settings)}" + _graph_note(recipes, model, precision))
            continue
        decided = decided_before_calibration(recipes, model, precision, "emulated")
        if decided is not None:  # the case is skipped or failed by its coverage whatever the search chose
            print(f"{model} {precision}: not searched: the case is {decided.status} before any calibration: "
                  f"{decided.message}")
            continue
        try:
            searched = recipes.search(model, precision)
            assert searched is not None
            holds = args.check and kept is not None and not searched.beats_incumbent
            entry = None if holds else recipes.entry(model, precision)  # a lock that holds ranks no layer again
        except HarnessError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed += 1
            continue
        if holds and kept is not None:
            missed = searched.incumbent is not None and searched.incumbent.passed is False
            now = (pipeline.store.fp32_sha256(model), pipeline.store.data_key(model, "calibration"))
            stale = (kept.graph_sha256, kept.calibration_data) != now
            print(f"{model} {precision}: the lock holds ({_words(kept.settings)}; no candidate significantly "
                  "better on the held-out samples" + ("; it misses the case's bounds there, as it did when locked"
                                                      if missed else "") + ")" + (
                "; its entry names an earlier graph or calibration set: the proposed lock names these" if stale
                else ""))
            if stale:  # adopted, the proposed lock no longer says "locked for an earlier graph" on every run
                proposed.append((model, precision, kept.model_copy(update={
                    "graph_sha256": now[0], "calibration_data": now[1], "qdq_sha256": None})))
            continue
        assert entry is not None
        if args.check and kept is None:
            print(f"{model} {precision}: not locked yet; the search chose {_words(entry.settings)}")
            proposed.append((model, precision, entry))
            continue
        if args.check and kept is not None:
            gain = _gain(searched)
            print(f"{model} {precision}: {_words(entry.settings)} beats the locked {_words(kept.settings)}{gain}")
            proposed.append((model, precision, entry))
            continue
        change = "added" if kept is None else "unchanged" if kept.settings == entry.settings and \
            kept.float_layers == entry.float_layers else f"was {_words(kept.settings)}"
        print(f"{model} {precision}: {_words(entry.settings)}, {len(entry.float_layers)} layers in float ({change})")
        lock.put(model, precision, entry)
    if args.check:
        if proposed:
            for model, precision, entry in proposed:
                lock.put(model, precision, entry)
            target = lock.write(path.with_name(path.name + ".proposed"))
            print(f"proposed lock: {target} (diff it against {path}; commit it in its place to take it)")
            return PROPOSED
        return 1 if failed else 0
    if lock.recipes:
        print(f"lock: {lock.write()}")
    return 1 if failed else 0


def _words(settings: "RecipeSettings") -> str:
    return "{" + ", ".join(f"{key}: {value}" for key, value in settings.to_dict().items()) + "}"


def _gain(searched: "SearchResult") -> str:
    chosen = next((c for c in searched.candidates if c.settings == searched.chosen), None)
    if chosen is None or chosen.score_db is None or searched.incumbent is None or searched.incumbent.score_db is None:
        return ""
    return (f" by {chosen.score_db - searched.incumbent.score_db:.2f} dB of SNR on {searched.held_out_samples} "
            "held-out samples")


def _graph_note(recipes: "Resolver", model: str, precision: str) -> str:
    state = recipes.lock_state(model, precision)
    return f"; {state.note}" if state and state.note else ""
