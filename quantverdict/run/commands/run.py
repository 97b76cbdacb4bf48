"""``quantverdict run``: run the model × precision × backend matrix and write a record."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from quantverdict.run.commands import common
from quantverdict.run.interrupt import received
from quantverdict.run.settings import Settings, add_options

HELP = 'run the model × precision × backend matrix and write a record'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser.add_argument)


def run(args: argparse.Namespace) -> int:
    return run_matrix(common.settings(args))[0]


def run_matrix(settings: Settings) -> tuple[int, Path]:
    """The main job: every case, a table on stdout, a record on disk; (exit code, record path)."""
    from tqdm import tqdm

    from quantverdict.report.record import build_record, check_destinations, record_run
    from quantverdict.run.cases import Shard
    from quantverdict.run.pipeline import Pipeline

    started = time.time()
    check_destinations(settings["report-dir"], settings["history-db"])
    pipeline = Pipeline.from_settings(settings)
    cases = pipeline.cases(settings["models"], settings["precisions"], settings["backends"])
    shard = Shard.parse(settings["shard"]) if settings["shard"] else None
    if shard is not None:
        cases = shard.select(cases)
    results = []
    with tqdm(cases, unit="case", file=sys.stderr, disable=None) as progress:
        for case in progress:
            progress.set_postfix_str(case.id)
            results.append(pipeline.run(case))
    if received():  # a Ctrl-C some library swallowed: this run did not finish
        raise KeyboardInterrupt
    print(format_table([r.to_dict() for r in results]))
    record = build_record([r.to_dict() for r in results], pipeline.caps, started, dict(pipeline.cache.stats),
                          shard.to_dict() if shard else None)
    path, history_problem = record_run(record, settings["report-dir"], settings["history-db"])
    summary = ", ".join(f"{count} {status}" for status, count in sorted(record["summary"].items()))
    print(f"\n{summary} in {record['duration_s']:.0f} s; record: {path}")
    for result in results:
        if result.status in ("failed", "error"):
            print(f"\n{result.message}")
    code = 0 if all(r.status in ("passed", "skipped") for r in results) else 1
    if history_problem:
        print(f"error: {history_problem}", file=sys.stderr)
        code = code or 2
    return code, path


def format_table(cases: list[dict]) -> str:
    """One line per case: the headline metrics of its first output, task accuracy if any, the
    recipe's SNR on its graph's semantics and the runtime's fidelity (quantized cases), and the
    95% interval of the accuracy drop or top-1 agreement."""
    from quantverdict.report.load import verdicts

    header = f"{'model':<18} {'precision':<9} {'backend':<12} {'cosine':>8} {'snr_db':>7} {'top1':>6} " \
             f"{'acc':>6} {'Δacc':>6} {'recipe':>11} {'flips':>6}  {'95% interval':<22} result"
    lines = [header, "-" * len(header)]
    for case in cases:
        metrics = next(iter(case["metrics"].get("metrics", {}).values()), {})
        task, verdict = case["metrics"].get("task", {}), verdicts(case)
        recipe = f"{verdict['recipe']} {common.fmt(verdict['recipe_snr_db'], '.1f', 5)}" if verdict["recipe"] else "-"
        flips = f"{100 * verdict['flip_fraction']:.2g}%" if verdict["flip_fraction"] is not None else "-"
        cells = [common.fmt(metrics.get("cosine"), ".5f", 8), common.fmt(metrics.get("snr_db"), ".1f", 7),
                 common.fmt(metrics.get("top1_agreement"), ".3f", 6), common.fmt(task.get("accuracy"), ".3f", 6),
                 common.fmt(0.0 - task["accuracy_drop_points"] if task else None, "+.2f", 6), recipe.rjust(11), flips.rjust(6),
                 (verdict["interval"] or "-").ljust(22)]
        outcome = case["status"] if case["status"] != "skipped" else f"skipped: {case['message']}"
        lines.append(f"{case['model']:<18} {case['precision']:<9} {case['backend']:<12} {' '.join(cells)} {outcome}")
    return "\n".join(lines)
