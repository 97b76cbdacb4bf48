"""``quantverdict formats``: which 8-bit format suits each tensor the INT8/FP8 recipes  quantize: its rounding SNR in INT8 and in FP8 E4M3."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from quantverdict.cache import atomic_write_bytes
from quantverdict.run.commands import common

HELP = 'which 8-bit format suits each tensor the INT8/FP8 recipes  quantize: its rounding SNR in INT8 and in FP8 E4M3'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model")
    parser.add_argument("--json", type=Path, help="also write every tensor's figures here")
    common.common_options(parser)


def run(args: argparse.Namespace) -> int:
    """Each quantized tensor's rounding SNR in INT8 and FP8 E4M3 (:mod:`quantverdict.judge.formats`)."""
    from quantverdict.judge.formats import format_fit, summarize

    pipeline = common.pipeline(args)
    fits = format_fit(pipeline.store, args.model)
    print(f"{'tensor':<56} {'kind':<10} {'int8_db':>7} {'fp8_db':>7} {'lead':>6}  quantized by   "
          "(rounding SNR on the calibration set; lead: INT8's over FP8)")
    for fit in fits:
        int8, fp8 = fit.snr_db["int8"], fit.snr_db["fp8"]
        print(f"{fit.tensor[-56:]:<56} {fit.kind:<10} {int8:>7.1f} {fp8:>7.1f} {int8 - fp8:>+6.1f}  "
              f"{', '.join(fit.quantized_by) or '-'}")
    summary = summarize(fits)
    for kind, row in summary.items():
        print(f"\n{kind}s: {row['tensors']}; finer in int8: {row['finer']['int8']}, in fp8: {row['finer']['fp8']}; "
              f"median SNR int8 {row['median_snr_db']['int8']:.1f} dB, fp8 {row['median_snr_db']['fp8']:.1f} dB; "
              f"median lead of int8 {row['median_int8_lead_db']:+.1f} dB")
        for precision, worst in row["worst"].items():  # the few that decide, which the median hides
            other = next(p for p in row["worst"] if p != precision)
            listed = "; ".join(f"{w['tensor'][-40:]} {w['snr_db'][precision]:.1f} dB ({other} {w['snr_db'][other]:.1f})"
                               for w in worst)
            print(f"  coarsest in {precision}: {listed}")
    if args.json:
        document = {"model": args.model, "summary": summary, "tensors": [vars(fit) for fit in fits]}
        atomic_write_bytes(args.json, json.dumps(document, indent=1).encode())
    return 0
