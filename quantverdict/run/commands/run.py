"""``quantverdict run``: run the model × precision × backend matrix and write a record."""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

from quantverdict.report.rows import CaseRow, terminal_table
from quantverdict.resources import cpu_seconds, peak_memory_mb
from quantverdict.run.commands import common
from quantverdict.run.interrupt import held, received
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
    from quantverdict.run.shards import shard_of
    from quantverdict.run.pipeline import Pipeline
    from quantverdict.tune.lock import run_notes

    started, cpu = time.time(), cpu_seconds()
    check_destinations(settings["report-dir"], settings["history-db"], settings["cache-dir"])
    pipeline = Pipeline.from_settings(settings, progress=lambda line: tqdm.write(line, file=sys.stderr))
    models = settings["models"]
    if models is None:  # the main job: the slow built-ins only where named (ResNet-50 and -101 took 80 of its 104 s)
        every = [case.model for case in pipeline.cases(None, settings["precisions"], settings["backends"])]
        slow = [name for name in dict.fromkeys(every) if pipeline.models.get(name).slow]
        models = [name for name in dict.fromkeys(every) if name not in slow] or None
        if slow and models:
            print(f"left out, as slow: {', '.join(slow)} (name them with --models to run them)", file=sys.stderr)
    cases = pipeline.cases(models, settings["precisions"], settings["backends"])
    shard = shard_of(settings["shard"], settings["balance-by"], cases)
    if shard is not None:
        cases = shard.select(cases)
    results = []
    with tqdm(cases, unit="case", file=sys.stderr, disable=None) as progress, \
            warnings.catch_warnings(record=True) as caught:  # said once each under the table, not amid the progress
        warnings.simplefilter("always")
        for number, case in enumerate(progress, 1):
            progress.set_postfix_str(case.id)
            begun = time.perf_counter()
            results.append(pipeline.run(case))
            if progress.disable and results[-1].status != "skipped":  # a CI log: a line per case judged
                print(f"[{number}/{len(cases)}] {case.id}: {results[-1].status} ({time.perf_counter() - begun:.0f} s)",
                      file=sys.stderr, flush=True)
    if received():  # a Ctrl-C some library swallowed: this run did not finish
        raise KeyboardInterrupt
    print(terminal_table(CaseRow.of(r.record()) for r in results))
    said = Counter(f"{warning.category.__name__}: {warning.message}" for warning in caught)
    if said:
        print(f"\nwarnings, each once ({sum(said.values())} in all):")
        for text, count in said.items():
            print(f"  {text}" + (f" (×{count})" if count > 1 else ""))
    record = build_record([r.to_dict() for r in results], pipeline.caps, started, dict(pipeline.cache.stats),
                          shard.to_dict() if shard else None)
    with held():  # a Ctrl-C from here waits until the record's path is printed
        path, history_problem = record_run(record, settings["report-dir"], settings["history-db"])
        summary = ", ".join(f"{count} {status}" for status, count in sorted(record["summary"].items()))
        print(f"\n{summary} in {record['duration_s']:.0f} s ({cpu_seconds() - cpu:.0f} CPU-s, peak memory "
              f"{peak_memory_mb() / 1024:.1f} GB); record: {path}\n"
              f"its page (HTML, with plots) and Markdown: quantverdict report {path}", flush=True)
    for result in results:
        if result.status in ("failed", "error"):
            print(f"\n{result.message}")
    for line in run_notes([r.to_dict() for r in results], settings["lock"]):
        print(f"\n{line}")
    code = 0 if all(r.status in ("passed", "skipped") for r in results) else 1
    if all(r.status == "skipped" for r in results):  # nothing judged: no pass, whatever the reasons
        print(f"\nno case was judged: {len(results)} selected, every one skipped; a run that judges nothing does not "
              "pass (select cases this runner can run)")
        code = 1
    if history_problem:
        print(f"error: {history_problem}", file=sys.stderr)
        code = code or 2
    return code, path
