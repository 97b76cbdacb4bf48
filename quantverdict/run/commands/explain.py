"""``quantverdict explain``: why a case regressed between two runs. What moved is read off the two records
(:mod:`quantverdict.report.moved`); where the recipe moved, the case is run again here on the current graph with the
baseline's recipe settings, and the gate's rules say whether that restores the baseline's verdict: then the recipe
caused it, else what else moved did. What cannot be reproduced on this runner (the baseline's graph or data, another
package version, another runner class) is named as untested. Exit 0: explained or nothing regressed; 1: a regression
no swap tried here restores; 2: bad input."""
from __future__ import annotations

import argparse
from pathlib import Path
from quantverdict.run.settings import add_options

HELP = "say why a case regressed between two run records: what moved, and whether the baseline's recipe restores it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--current", type=Path, required=True)
    parser.add_argument("--case", help="the case to explain (default: every case that regressed)")
    add_options(parser.add_argument, ("gate-policy", "manifest", "tolerances", "cache-dir"))


def run(args: argparse.Namespace) -> int:
    from quantverdict.errors import HarnessError
    from quantverdict.precision.settings import RecipeSettings
    from quantverdict.report.gate import gate, judge_case, load_policy, rules_for
    from quantverdict.report.load import load_record
    from quantverdict.report.moved import moved
    from quantverdict.run.cases import Case
    from quantverdict.run.commands.common import settings
    from quantverdict.run.pipeline import Pipeline

    given = settings(args)
    policy = load_policy(given["gate-policy"])
    baseline, current = load_record(args.baseline), load_record(args.current)
    result = gate(baseline, current, policy)
    regressed = sorted({line.partition(":")[0] for line in result.moved})
    if args.case:
        if args.case not in {case.id for case in current.cases} or args.case not in {c.id for c in baseline.cases}:
            raise HarnessError(f"--case {args.case!r}: not a case of both records")
        regressed = [args.case]
    if not regressed:
        print("nothing regressed between the two runs: nothing to explain")
        return 0
    old_cases, new_cases = {c.id: c for c in baseline.cases}, {c.id: c for c in current.cases}
    unexplained = 0
    for case_id in regressed:
        old, new = old_cases[case_id], new_cases[case_id]
        print(f"{case_id}: {moved(old, new, baseline.environment, current.environment)}")
        before, now = old.metrics.fingerprint, new.metrics.fingerprint
        recipe_moved = before is not None and now is not None and before.recipe != now.recipe
        if not (recipe_moved and old.metrics.recipe and old.metrics.recipe.settings):
            print(f"{case_id}: untested here: no swap reproduces what moved (the baseline's graph, data, packages or "
                  "runner are not on this runner)")
            unexplained += 1
            continue
        swapped = RecipeSettings.recorded(old.metrics.recipe.settings, new.precision).to_dict()
        pipeline = Pipeline(given["cache-dir"], given["tolerances"], given["manifest"],
                            recipe_settings={new.precision: swapped})
        again = pipeline.run(Case(new.model, new.precision, new.backend)).record()
        still, _ = judge_case(case_id, old, again, rules_for(policy, new.precision),
                              baseline.environment.runner == pipeline.caps.runner_class)
        if still:
            print(f"{case_id}: the baseline's recipe settings {swapped} on this graph do not restore it ({still[0]}): "
                  "not the recipe; what else moved did")
            unexplained += 1
        else:
            print(f"{case_id}: the baseline's recipe settings {swapped} on this graph restore it: the recipe change "
                  "caused it")
    return 1 if unexplained else 0
