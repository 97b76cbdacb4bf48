"""``quantverdict compare-recipes``: the harness's, Model Optimizer's and ONNX Runtime's  quantization of one model side by side, and where  their Q/DQ placements differ."""
from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path
from typing import Any

from quantverdict.cache import atomic_write_bytes
from quantverdict.run.commands import common
from quantverdict.run.settings import recipe_settings

HELP = "the harness's, Model Optimizer's and ONNX Runtime's  quantization of one model side by side, and where  their Q/DQ placements differ"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model")
    parser.add_argument("--precision", default="int8", choices=["int8", "fp8"])
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
                            help="a recipe to add, e.g. 'mse:calibration=mse' or 'sq:smoothquant=0.8' (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the comparison here (for reports and history)")
    common.common_options(parser)


def run(args: argparse.Namespace) -> int:
    """The harness's recipe (the model's settings, or those its recipe search chose), ONNX Runtime's quantize_static (INT8) and
    Model Optimizer's (where installed), plus ``--variant``s, on the same data."""
    from quantverdict.judge.recipe_comparison import compare_quantizers
    from quantverdict.precision.settings import RecipeSettings
    from quantverdict.precision.modelopt import modelopt_python

    pipeline = common.pipeline(args)
    own = pipeline.recipes.settings(args.model, args.precision)
    if pipeline.recipes.auto(args.model, args.precision):  # recipe: auto, a manifest model's default
        print(f"(harness: the settings recipe auto chose for {args.model}: {own.to_dict() or 'the defaults'})")
    variants = {"harness": own}
    if args.precision == "int8":
        variants["onnxruntime"] = RecipeSettings(quantizer="onnxruntime")
    if modelopt_python() is not None:
        variants["modelopt"] = RecipeSettings(quantizer="modelopt")
    else:
        print("(Model Optimizer not compared: set QUANTVERDICT_MODELOPT_PYTHON to a Python with nvidia-modelopt[onnx])")
    for variant in args.variant:
        label, _, assignments = variant.partition(":")
        settings = recipe_settings([f"{args.precision}:{a}" for a in assignments.split(",") if a])
        variants[label] = RecipeSettings.parse(settings.get(args.precision, {}), args.precision).over(own)
    results, differences = compare_quantizers(pipeline.store, args.model, args.precision, variants,
                                              functools.partial(pipeline.recipes.with_fallback, args.model),
                                              pipeline.tolerances)
    print(f"{'quantizer':<14} {'top1':>6} {'(all)':>6} {'cosine':>9} {'snr_db':>7} {'by kind':>13} {'layers':>9} "
          f"{'seconds':>8}  settings   (top1: on the samples FP32 decides at its inputs' resolution, where declared; "
          "by kind: what the output decides, as the verdict judges it)")
    for r in results:
        if r.error:
            print(f"{r.label:<14} failed after {r.seconds:.1f} s: {r.error}  (settings {r.settings or '-'})")
            continue
        top1, every = r.metrics.get("top1_agreement"), r.metrics.get("top1_agreement_all")
        print(f"{r.label:<14} {common.fmt(top1, '.3f', 6)} {common.fmt(every, '.3f', 6)} {r.metrics['cosine']:>9.5f} "
              f"{r.metrics['snr_db']:>7.2f} {_by_kind(r.metrics):>13} "
              f"{r.coverage['quantized']:>4}/{r.coverage['layers']:<4} {r.seconds:>8.1f}  {r.settings or '-'}")
    print(f"\nlayers not every quantizer puts in {args.precision}: {len(differences)}")
    for layer, labels in differences.items():
        print(f"  {layer:<48} quantized by: {', '.join(labels) or '-'}")
    if args.json:
        document = {"model": args.model, "precision": args.precision, "placement_differences": differences,
                    "quantizers": [{"label": r.label, "settings": r.settings, "coverage": r.coverage, "error": r.error,
                                    "seconds": r.seconds, "metrics": {k: v for k, v in r.metrics.items()
                                                                      if k not in ("error_histogram", "intervals")}}
                                   for r in results]}
        atomic_write_bytes(args.json, json.dumps(document, indent=1, default=str).encode())
    return 0


BY_KIND = {"detection_f1": "F1", "sequence_agreement": "text", "label_agreement": "labels", "region_iou": "region"}


def _by_kind(metrics: dict[str, Any]) -> str:
    """What the output decides, as its kind's verdict reads it (a detector's F1, a CTC output's texts read alike)."""
    return next((f"{word} {metrics[name]:.3f}" for name, word in BY_KIND.items() if metrics.get(name) is not None), "-")
