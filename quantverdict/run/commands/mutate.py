"""``quantverdict mutate``: plant the defect catalogue into models; report what each check  catches and the false alarms of clean reruns."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from quantverdict.cache import atomic_write_bytes
from quantverdict.run.commands import common
from quantverdict.run.settings import add_options

HELP = 'plant the defect catalogue into models; report what each check  catches and the false alarms of clean reruns'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", type=common.csv, help="comma-separated (default: every built-in not marked slow)")
    parser.add_argument("--catalogue", type=Path, help="defect catalogue (default: the packaged one)")
    parser.add_argument("--reruns", type=int, default=10, help="clean reruns on a cold cache, for false alarms")
    add_options(parser.add_argument, ("gate-policy",))
    parser.add_argument("--min-power", type=float, default=0.95, help="exit 1 below this fraction caught")
    parser.add_argument("--json", type=Path, help="also write every planted defect and verdict as JSON here")
    common.common_options(parser)


def run(args: argparse.Namespace) -> int:
    from quantverdict.judge.mutations import load_catalogue
    from quantverdict.run.mutate import MIN_ACCURACY_COST, MIN_SNR_COST_DB, run_campaign
    from quantverdict.run.pipeline import Pipeline

    resolved = common.settings(args)
    pipeline = Pipeline.from_settings(resolved)
    manifest = resolved["manifest"]
    models = args.models or [n for n in pipeline.models.names() if not pipeline.models.get(n).slow]
    campaign = run_campaign(pipeline, models, load_catalogue(args.catalogue), args.reruns,
                            policy=resolved["gate-policy"],
                            fresh_pipeline=lambda cache: Pipeline(cache, manifest=manifest))
    print(f"runner class: {pipeline.caps.runner_class}; significant = costs ≥ {MIN_SNR_COST_DB:g} dB SNR or "
          f"≥ {MIN_ACCURACY_COST:g} point of accuracy (on the graph's semantics)")
    print(f"{'defect kind':<26} {'planted':>7} {'signif.':>7} {'tolerance':>9} {'baseline':>9} {'any':>6}   "
          "(fraction of significant caught; of all planted in brackets)")
    for row in campaign.table():
        cells = [f"{common.fmt(row[c], '.2f', 4)} ({row[c + '_all']:.2f})" for c in ("tolerance", "baseline", "any")]
        print(f"{row['kind']:<26} {row['planted']:>7} {row['significant']:>7} {' '.join(cells)}")
    power, alone = campaign.power(), campaign.power("tolerance")
    print(f"\ncaught: {common.fmt(power, '.3f', 5)} of significant defects by the tolerance table or the baseline "
          f"rules; {common.fmt(alone, '.3f', 5)} by the tolerance table alone")
    print(f"false alarms: {len(campaign.false_alarms)} in {campaign.clean_reruns} clean rerun(s) of "
          f"{len(models)} model(s)" + "".join(f"\n  {line}" for line in campaign.false_alarms))
    for item in campaign.planted:
        if item.significant and "any" not in item.caught_by:
            print(f"missed: {item.defect} on {item.model}-{item.precision} (SNR cost {item.snr_cost_db:.1f} dB)")
    if args.json:
        atomic_write_bytes(args.json, json.dumps(campaign.to_dict(), indent=1, default=str).encode())
    return 0 if (power is None or power >= args.min_power) and not campaign.false_alarms else 1
