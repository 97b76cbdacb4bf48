"""``quantverdict sensitivity``: per-layer quantization error, and FP32 fallback."""
from __future__ import annotations

import argparse

from quantverdict.run.commands import common
from quantverdict.run.settings import recipe_settings

HELP = 'per-layer quantization error, and FP32 fallback'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model")
    parser.add_argument("--precision", default="int8", choices=["int8", "fp8"])
    parser.add_argument("--calibration", help="calibration method (default: the model's, else max)")
    parser.add_argument("--recipe-option", action="append", default=[], metavar="KEY=VALUE",
                             help="recipe setting, e.g. smoothquant=0.5 (repeatable)")
    parser.add_argument("--min-cosine", type=float, help="fall back the most sensitive layers until met")
    common.common_options(parser)


def run(args: argparse.Namespace) -> int:
    from quantverdict.run.pipeline import Pipeline
    from quantverdict.judge.sensitivity import fallback_until_within, layer_sensitivity
    from quantverdict.judge.tolerances import Tolerance

    from quantverdict.precision.settings import RecipeSettings

    settings = recipe_settings(args.recipe_option)
    off = RecipeSettings(fallback=None).to_dict()  # every layer ranked: the model's fallback off
    settings[args.precision] = {**off, **settings.get(args.precision, {})}
    shared = common.settings(args)
    pipeline = Pipeline(shared["cache-dir"], manifest=shared["manifest"], calibration=args.calibration,
                        recipe_settings=settings)
    pipeline.models.get(args.model)
    recipe = pipeline.recipes.recipe(args.model, args.precision, "emulated")
    print(f"{'layer':<48} {'op':<8} {'cosine':>9} {'snr_db':>7}   (only this layer quantized)")
    for row in layer_sensitivity(pipeline.store, args.model, recipe):
        print(f"{row.layer:<48} {row.op:<8} {row.cosine:>9.6f} {row.snr_db:>7.1f}")
    if args.min_cosine is None:
        return 0
    _, kept, result = fallback_until_within(pipeline.store, args.model, recipe, Tolerance(min_cosine=args.min_cosine))
    verdict = "met" if result.passed else "NOT met"
    print(f"\ncosine ≥ {args.min_cosine} {verdict} with {len(kept)} layer(s) kept in FP32: {', '.join(kept) or '-'}")
    return 0 if result.passed else 1
