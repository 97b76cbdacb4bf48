"""``quantverdict bench``: GPU lane: torch CUDA throughput per precision, FP8 linears, overhead."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from quantverdict.cache import atomic_write_bytes
from quantverdict.errors import HarnessError
from quantverdict.run.commands import common

HELP = 'GPU lane: torch CUDA throughput per precision, FP8 linears, overhead'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batches", type=common.csv, default=["1", "64"])
    parser.add_argument("--precisions", type=common.csv, default=["fp32", "tf32", "fp16", "bf16"])
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="dense bf16 rate to compare with")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--compile", action="store_true", help="also torch.compile the model (default: eager)")
    common.common_options(parser)


def run(args: argparse.Namespace) -> int:
    from quantverdict.perf import gpu_lane
    from quantverdict.capabilities import detect

    caps = detect()
    if caps.gpu is None:
        raise HarnessError("bench measures the GPU lane and needs a CUDA GPU; none found")
    store = common.pipeline(args).store
    inputs = store.spec(args.model).inputs
    if len(inputs) != 1 or not inputs[0].dtype.startswith("float"):
        raise HarnessError(f"bench times models of one float input; {args.model!r} has "
                           f"{', '.join(f'{item.name} ({item.dtype})' for item in inputs)}")
    module, sample = store.module(args.model), tuple(inputs[0].shape[1:])  # the declared shape, each batch size
    figures: dict = {"gpu": caps.to_dict()["gpu"], "model": args.model,
                     "lane": gpu_lane.lane(module, sample, [int(b) for b in args.batches], args.precisions,
                                           args.peak_tflops, args.compile),
                     "overhead": {b: gpu_lane.harness_overhead(module, (int(b), *sample)) for b in args.batches}}
    print(f"{'batch':>5} {'prec':<5} {'ms':>8} {'hand ms':>8} {'hand/ours (min–max)':>20} {'graph ms':>8} {'img/s':>9} "
          f"{'×fp32 graph (min–max)':>22} {'TFLOP/s':>8} {'of peak':>8}   (channels_last{', compiled' if args.compile else ''})")
    for row in figures["lane"]:
        r, h = row["vs_fp32"], row["vs_hand_loop"]
        print(f"{row['batch']:>5} {row['precision']:<5} {row['median_ms']:>8.3f} {row['hand_loop_ms']:>8.3f} "
              f"{h['median']:>8.3f} ({h['low']:.2f}–{h['high']:.2f}) {row['cuda_graph_median_ms']:>8.3f} "
              f"{row['images_per_s']:>9.0f} {r['median']:>10.2f} ({r['low']:.2f}–{r['high']:.2f}) {row['tflops']:>8.1f} "
              f"{row['fraction_of_peak']:>7.1%}")
    print("overhead:", json.dumps(figures["overhead"]))
    reason = caps.gpu_requirement("fp8")
    figures["fp8_linear"] = reason or gpu_lane.fp8_linear_stack()
    print("fp8 linear stack:", json.dumps(figures["fp8_linear"]))
    figures["transformer_block"] = reason or gpu_lane.transformer_block_speedup()
    print("transformer block (FP8/INT8 GEMMs vs BF16):", json.dumps(figures["transformer_block"]))
    if args.json:
        atomic_write_bytes(args.json, json.dumps(figures, indent=1).encode())
    return 0
