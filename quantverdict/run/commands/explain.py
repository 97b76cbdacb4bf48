"""``quantverdict explain``: why a case regressed between two runs. What moved is read off the two records
(:mod:`quantverdict.report.moved`); where the recipe moved, the case is run again here on the current graph with the
baseline's recipe settings, and where the graph moved and the cache still holds the baseline's FP32 graph, again on
that graph with the current recipe settings; the gate's rules say whether each swap restores the baseline's verdict:
the component it swapped back caused it. What cannot be reproduced on this runner (the baseline's data, another
package version, another runner class) is named as untested. Exit 0: explained or nothing regressed; 1: a regression
no swap tried here restores; 2: bad input."""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from quantverdict.run.settings import add_options

HELP = "say why a case regressed between two run records: what moved, and whether the baseline's recipe restores it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--current", type=Path, required=True)
    parser.add_argument("--case", help="the case to explain (default: every case that regressed)")
    add_options(parser.add_argument, ("gate-policy", "manifest", "tolerances", "cache-dir"))


def cached_graph(cache_dir: Path, sha256: str) -> Path | None:
    """The FP32 graph of that hash among the cache's (a baseline run's, where the cache still holds it)."""
    from quantverdict.hashing import file_sha256

    return next((path for path in sorted((cache_dir / "normalised").glob("*/*.onnx")) if file_sha256(path) == sha256),
                None)


def run(args: argparse.Namespace) -> int:
    from quantverdict.errors import HarnessError
    from quantverdict.precision.settings import RecipeSettings
    from quantverdict.report.gate import gate, judge_case, load_policy, rules_for
    from quantverdict.report.load import load_record
    from quantverdict.report.moved import moved
    from quantverdict.run.artifacts import ArtifactStore
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
        swaps = []  # (what was swapped, the component it tests, its recipe settings, the graph it runs on)
        if before is not None and now is not None and before.recipe != now.recipe and old.metrics.recipe \
                and old.metrics.recipe.settings:
            swaps.append(("the baseline's recipe settings {} on this graph", "the recipe change",
                          old.metrics.recipe.settings, None))
        graph = cached_graph(given["cache-dir"], before.graph) if before and now and before.graph and \
            before.graph != now.graph and new.metrics.recipe and new.metrics.recipe.settings else None
        if graph is not None:
            swaps.append(("the current recipe settings {} on the baseline's graph (found in the cache)",
                          "the graph change", new.metrics.recipe.settings, graph))
        if not swaps:
            print(f"{case_id}: untested here: no swap reproduces what moved (the baseline's graph, data, packages or "
                  "runner are not on this runner)")
            unexplained += 1
            continue
        causes = []
        for words, component, recorded, on_graph in swaps:
            swapped = RecipeSettings.recorded(recorded, new.precision).to_dict()
            pipeline = Pipeline(given["cache-dir"], given["tolerances"], given["manifest"],
                                recipe_settings={new.precision: swapped})
            if on_graph is not None:  # the model as it was: its FP32 graph from the cache
                spec = replace(pipeline.models.get(new.model), build=None, onnx_path=on_graph, build_files=None)
                pipeline = pipeline.on_store(ArtifactStore(pipeline.cache, pipeline.models.replaced(new.model, spec),
                                                           pipeline.backend, pipeline.tolerances, pipeline.caps))
            again = pipeline.run(Case(new.model, new.precision, new.backend)).record()
            still, _ = judge_case(case_id, old, again, rules_for(policy, new.precision),
                                  baseline.environment.runner == pipeline.caps.runner_class)
            said = words.format(swapped)
            print(f"{case_id}: {said} restore it: {component} caused it" if not still else
                  f"{case_id}: {said} do not restore it ({still[0]}): not {component}")
            causes += [] if still else [component]
        if not causes:
            print(f"{case_id}: no swap tried here restores it: " + ("what else moved did" if len(swaps) == 1 else
                  "the components swapped back each cost part of it together, or what else moved did"))
            unexplained += 1
    return 1 if unexplained else 0
