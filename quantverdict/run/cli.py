"""``python -m quantverdict``: the main job (``run``), the environment report (``env``), the model list.

Bad input (unknown names, corrupt files, a model that rejects its inputs) is printed as one
line, ``error: …``, with exit code 2; failing cases give exit code 1.
"""
from __future__ import annotations

import argparse
import html
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from quantverdict.cache import atomic_write_bytes
from quantverdict.errors import HarnessError
from quantverdict.run import init
from quantverdict.run.settings import COMMON, Settings, add_options, recipe_settings

if TYPE_CHECKING:
    from quantverdict.run.pipeline import Pipeline


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _common(parser: argparse.ArgumentParser) -> None:
    add_options(parser.add_argument, COMMON)


def _settings(args: argparse.Namespace) -> Settings:
    """The command line over the project's [tool.quantverdict] over the defaults."""
    return Settings.resolve(vars(args), Path.cwd())


def _pipeline(args: argparse.Namespace) -> "Pipeline":
    from quantverdict.run.pipeline import Pipeline

    return Pipeline.from_settings(_settings(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m quantverdict", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the model × precision × backend matrix and write a record")
    add_options(run.add_argument)
    sensitivity = commands.add_parser("sensitivity", help="per-layer quantization error, and FP32 fallback")
    sensitivity.add_argument("model")
    sensitivity.add_argument("--precision", default="int8", choices=["int8", "fp8"])
    sensitivity.add_argument("--calibration", help="calibration method (default: the model's, else max)")
    sensitivity.add_argument("--recipe-option", action="append", default=[], metavar="KEY=VALUE",
                             help="recipe setting, e.g. smoothquant=0.5 (repeatable)")
    sensitivity.add_argument("--min-cosine", type=float, help="fall back the most sensitive layers until met")
    _common(sensitivity)
    quantizers = commands.add_parser("compare-recipes", help="the harness's, Model Optimizer's and ONNX Runtime's "
                                                             "quantization of one model side by side, and where "
                                                             "their Q/DQ placements differ")
    quantizers.add_argument("model")
    quantizers.add_argument("--precision", default="int8", choices=["int8", "fp8"])
    quantizers.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE[,KEY=VALUE]",
                            help="a recipe to add, e.g. 'mse:calibration=mse' or 'sq:smoothquant=0.8' (repeatable)")
    quantizers.add_argument("--json", type=Path, help="also write the comparison here (for reports and history)")
    _common(quantizers)
    formats = commands.add_parser("formats", help="which 8-bit format suits each tensor the INT8/FP8 recipes "
                                                  "quantize: its rounding SNR in INT8 and in FP8 E4M3")
    formats.add_argument("model")
    formats.add_argument("--json", type=Path, help="also write every tensor's figures here")
    _common(formats)
    prune = commands.add_parser("prune-cache", help="remove the artifacts used least recently: those unused for "
                                                     "--unused-days, then more down to --max-size")
    prune.add_argument("--max-size", type=_size, help="what the cache may keep, e.g. 20G, 500M (bytes without a unit)")
    prune.add_argument("--unused-days", type=float, help="remove every artifact unused for this many days")
    prune.add_argument("--cache-dir", type=Path, default=Path(".quantverdict-cache"))
    report = commands.add_parser("report", help="render a run record as Markdown and a self-contained HTML page")
    report.add_argument("record", type=Path)
    report.add_argument("--history", type=Path, help="folder of earlier run records, for trends")
    report.add_argument("--out", type=Path, help="where RUN.md and RUN.html go (default: beside the record)")
    report.add_argument("--history-db", type=Path, help="run history whose change points for this runner class the "
                                                        "page shows (default: history.sqlite beside the record)")
    report.add_argument("--profile", default="nightly", choices=["nightly", "premerge"], help="history policy profile")
    gate = commands.add_parser("gate", help="compare a run with a baseline; exit 1 on a regression, 2 on bad input")
    gate.add_argument("--baseline", type=Path, required=True)
    gate.add_argument("--current", type=Path, required=True)
    add_options(gate.add_argument, ("gate-policy",))
    timings = commands.add_parser("compare-timings", help="two saved pytest-benchmark runs: Mann-Whitney U and a "
                                                         "ratio per benchmark; exit 1 on a regression")
    timings.add_argument("base", type=Path)
    timings.add_argument("current", type=Path)
    timings.add_argument("--ratio", type=float, default=1.1, help="median ratio that counts (default 1.1)")
    timings.add_argument("--alpha", type=float, default=0.002, help="Mann-Whitney p-value needed (default 0.002)")
    history = commands.add_parser("history", help="judge every case's metric series over the run history; "
                                                  "exit 1 on a regression, 2 on bad input")
    history.add_argument("--db", type=Path, default=Path("reports/history.sqlite"))
    history.add_argument("--profile", default="nightly", choices=["nightly", "premerge"])
    history.add_argument("--history-policy", type=Path, help="history policy file (default: the packaged one)")
    history.add_argument("--all", action="store_true", help="also list (and with --page, draw) stable series")
    history.add_argument("--page", type=Path, help="also write an HTML page: what changed since the last good run, "
                                                   "and a trend chart per flagged series with its change points")
    merge = commands.add_parser("merge", help="combine shard records (run --shard i/n) into one run record")
    merge.add_argument("shards", type=Path, nargs="+")
    merge.add_argument("--out", type=Path, required=True)
    nightly = commands.add_parser("nightly", help="timed run of the full matrix + report, under reports/nightly/<time>/")
    nightly.add_argument("--root", type=Path, default=Path("reports/nightly"))
    _common(nightly)
    bench = commands.add_parser("bench", help="GPU lane: torch CUDA throughput per precision, FP8 linears, overhead")
    bench.add_argument("--model", default="resnet50")
    bench.add_argument("--batches", type=_csv, default=["1", "64"])
    bench.add_argument("--precisions", type=_csv, default=["fp32", "tf32", "fp16", "bf16"])
    bench.add_argument("--peak-tflops", type=float, default=790.0, help="dense bf16 rate to compare with")
    bench.add_argument("--out", type=Path, help="also write the figures as JSON here")
    bench.add_argument("--compile", action="store_true", help="also torch.compile the model (default: eager)")
    _common(bench)
    mutate = commands.add_parser("mutate", help="plant the defect catalogue into models; report what each check "
                                                "catches and the false alarms of clean reruns")
    mutate.add_argument("--models", type=_csv, help="comma-separated (default: every built-in not marked slow)")
    mutate.add_argument("--catalogue", type=Path, help="defect catalogue (default: the packaged one)")
    mutate.add_argument("--reruns", type=int, default=10, help="clean reruns on a cold cache, for false alarms")
    add_options(mutate.add_argument, ("gate-policy",))
    mutate.add_argument("--min-power", type=float, default=0.95, help="exit 1 below this fraction caught")
    mutate.add_argument("--out", type=Path, help="also write every planted defect and verdict as JSON here")
    _common(mutate)
    _common(commands.add_parser("models", help="list registered models"))
    init.add_arguments(commands.add_parser("init", help="a starter manifest, its project setting and .gitignore "
                                                        "lines in a repository"))
    commands.add_parser("env", help="print GPU, packages and the precision support matrix")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        commands = {"run": _run, "models": _models, "env": _env, "sensitivity": _sensitivity, "report": _report,
                    "gate": _gate, "nightly": _nightly, "bench": _bench, "mutate": _mutate,
                    "merge": _merge, "compare-timings": _compare_timings, "history": _history,
                    "compare-recipes": _compare_recipes, "formats": _formats,
                    "prune-cache": _prune_cache, "init": init.run}
        return commands[args.command](args)
    except HarnessError as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    return run_matrix(_settings(args))[0]


def run_matrix(settings: Settings) -> tuple[int, Path]:
    """The main job: every case, a table on stdout, a record on disk; (exit code, record path)."""
    from tqdm import tqdm

    from quantverdict.report.record import build_record, write_record
    from quantverdict.run.cases import Shard
    from quantverdict.run.pipeline import Pipeline

    started = time.time()
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
    print(format_table([r.to_dict() for r in results]))
    record = build_record([r.to_dict() for r in results], pipeline.caps, started, dict(pipeline.cache.stats),
                          shard.to_dict() if shard else None)
    path = write_record(record, settings["report-dir"], settings["history-db"])
    summary = ", ".join(f"{count} {status}" for status, count in sorted(record["summary"].items()))
    print(f"\n{summary} in {record['duration_s']:.0f} s; record: {path}")
    for result in results:
        if result.status in ("failed", "error"):
            print(f"\n{result.message}")
    return (0 if all(r.status in ("passed", "skipped") for r in results) else 1), path


def _report(args: argparse.Namespace) -> int:
    from quantverdict.report.load import history, load_record
    from quantverdict.report.record import HISTORY_DB
    from quantverdict.report.render import html_page, markdown

    record = load_record(args.record)
    past = [r for r in history(args.history) if r.get("started") != record.get("started")] if args.history else []
    out = args.out or args.record.parent
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(record)
    atomic_write_bytes(out / f"{args.record.stem}.md", text.encode())
    db = getattr(args, "history_db", None) or args.record.parent / HISTORY_DB
    sections = []
    if db.is_file():
        from quantverdict.report.history import judge_history, load_policies
        from quantverdict.report.history_page import history_section

        profile = getattr(args, "profile", "nightly")
        verdicts = judge_history(db, load_policies(None, profile))
        sections.append(history_section(db, verdicts, record["environment"].get("runner_class", "unknown"),
                                        profile=profile))
    page = out / f"{args.record.stem}.html"
    atomic_write_bytes(page, html_page(record, past, sections).encode())
    print(text)
    print(f"page: {page}")
    return 0


def _gate(args: argparse.Namespace) -> int:
    from quantverdict.report.gate import gate, load_policy
    from quantverdict.report.load import load_record

    result = gate(load_record(args.baseline), load_record(args.current), load_policy(args.gate_policy))
    print(result.report())
    return result.exit_code


def _nightly(args: argparse.Namespace) -> int:
    """Timed full matrix into reports/nightly/<time>/, then the page with the history's trends."""
    from quantverdict.report.record import HISTORY_DB

    folder = args.root / time.strftime("%Y%m%d-%H%M%S")
    db = args.root / HISTORY_DB  # one history for every nightly run, beside their folders
    code, record = run_matrix(Settings.resolve({**vars(args), "time": True, "report_dir": folder, "history_db": db},
                                               Path.cwd()))
    _report(argparse.Namespace(record=record, history=args.root, out=folder, history_db=db, profile="nightly"))
    return code


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
        recipe = f"{verdict['recipe']} {_fmt(verdict['recipe_snr_db'], '.1f', 5)}" if verdict["recipe"] else "-"
        flips = f"{100 * verdict['flip_fraction']:.2g}%" if verdict["flip_fraction"] is not None else "-"
        cells = [_fmt(metrics.get("cosine"), ".5f", 8), _fmt(metrics.get("snr_db"), ".1f", 7),
                 _fmt(metrics.get("top1_agreement"), ".3f", 6), _fmt(task.get("accuracy"), ".3f", 6),
                 _fmt(0.0 - task["accuracy_drop_points"] if task else None, "+.2f", 6), recipe.rjust(11), flips.rjust(6),
                 (verdict["interval"] or "-").ljust(22)]
        outcome = case["status"] if case["status"] != "skipped" else f"skipped: {case['message']}"
        lines.append(f"{case['model']:<18} {case['precision']:<9} {case['backend']:<12} {' '.join(cells)} {outcome}")
    return "\n".join(lines)



def _fmt(value: float | None, spec: str, width: int) -> str:
    return f"{value:{spec}}".rjust(width) if value is not None else "-".rjust(width)


def _sensitivity(args: argparse.Namespace) -> int:
    from quantverdict.run.pipeline import Pipeline
    from quantverdict.judge.sensitivity import fallback_until_within, layer_sensitivity
    from quantverdict.judge.tolerances import Tolerance

    settings = recipe_settings(args.recipe_option)
    settings.setdefault(args.precision, {}).setdefault("fallback", None)  # every layer ranked, the model's fallback off
    common = _settings(args)
    pipeline = Pipeline(common["cache-dir"], manifest=common["manifest"], calibration=args.calibration,
                        recipe_settings=settings)
    pipeline.models.get(args.model)
    recipe = pipeline.store.recipe(args.model, args.precision, "emulated")
    print(f"{'layer':<48} {'op':<8} {'cosine':>9} {'snr_db':>7}   (only this layer quantized)")
    for row in layer_sensitivity(pipeline.store, args.model, recipe):
        print(f"{row.layer:<48} {row.op:<8} {row.cosine:>9.6f} {row.snr_db:>7.1f}")
    if args.min_cosine is None:
        return 0
    _, kept, result = fallback_until_within(pipeline.store, args.model, recipe, Tolerance(min_cosine=args.min_cosine))
    verdict = "met" if result.passed else "NOT met"
    print(f"\ncosine ≥ {args.min_cosine} {verdict} with {len(kept)} layer(s) kept in FP32: {', '.join(kept) or '-'}")
    return 0 if result.passed else 1


def _compare_recipes(args: argparse.Namespace) -> int:
    """The harness's recipe (with the model's settings), ONNX Runtime's quantize_static (INT8) and
    Model Optimizer's (where installed), plus ``--variant``s, on the same data."""
    from quantverdict.judge.recipe_comparison import compare_quantizers
    from quantverdict.precision.modelopt import modelopt_python
    from quantverdict.run.pipeline import Pipeline

    pipeline = _pipeline(args)
    own = dict(pipeline.models.get(args.model).recipe.get(args.precision, {}))
    variants: dict[str, dict[str, Any]] = {"harness": own}
    if args.precision == "int8":
        variants["onnxruntime"] = {"quantizer": "onnxruntime"}
    if modelopt_python() is not None:
        variants["modelopt"] = {"quantizer": "modelopt"}
    else:
        print("(Model Optimizer not compared: set QUANTVERDICT_MODELOPT_PYTHON to a Python with nvidia-modelopt[onnx])")
    for variant in args.variant:
        label, _, assignments = variant.partition(":")
        settings = recipe_settings([f"{args.precision}:{a}" for a in assignments.split(",") if a])
        variants[label] = {**own, **settings.get(args.precision, {})}
    results, differences = compare_quantizers(pipeline.store, args.model, args.precision, variants)
    print(f"{'quantizer':<14} {'top1':>6} {'(all)':>6} {'cosine':>9} {'snr_db':>7} {'layers':>9} {'seconds':>8}  "
          "settings   (top1: on the samples FP32 decides at its inputs' resolution, where declared)")
    for r in results:
        top1, every = r.metrics.get("top1_agreement"), r.metrics.get("top1_agreement_all")
        print(f"{r.label:<14} {_fmt(top1, '.3f', 6)} {_fmt(every, '.3f', 6)} {r.metrics['cosine']:>9.5f} "
              f"{r.metrics['snr_db']:>7.2f} "
              f"{r.coverage['quantized']:>4}/{r.coverage['layers']:<4} {r.seconds:>8.1f}  {r.settings or '-'}")
    print(f"\nlayers not every quantizer puts in {args.precision}: {len(differences)}")
    for layer, labels in differences.items():
        print(f"  {layer:<48} quantized by: {', '.join(labels) or '-'}")
    if args.json:
        document = {"model": args.model, "precision": args.precision, "placement_differences": differences,
                    "quantizers": [{"label": r.label, "settings": r.settings, "coverage": r.coverage,
                                    "seconds": r.seconds, "metrics": {k: v for k, v in r.metrics.items()
                                                                      if k not in ("error_histogram", "intervals")}}
                                   for r in results]}
        atomic_write_bytes(args.json, json.dumps(document, indent=1, default=str).encode())
    return 0


def _formats(args: argparse.Namespace) -> int:
    """Each quantized tensor's rounding SNR in INT8 and FP8 E4M3 (:mod:`quantverdict.judge.formats`)."""
    from quantverdict.judge.formats import format_fit, summarize
    from quantverdict.run.pipeline import Pipeline

    pipeline = _pipeline(args)
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
    if args.json:
        document = {"model": args.model, "summary": summary, "tensors": [vars(fit) for fit in fits]}
        atomic_write_bytes(args.json, json.dumps(document, indent=1).encode())
    return 0


def _size(text: str) -> int:
    """Bytes from '20G', '500M', '1.5T' or a plain number."""
    units = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
    text = text.strip().upper().removesuffix("B")
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 20G, 500M, or bytes)") from None


def _prune_cache(args: argparse.Namespace) -> int:
    from quantverdict.cache import Cache

    if args.max_size is None and args.unused_days is None:
        raise HarnessError("prune-cache needs --max-size, --unused-days or both")
    cache_dir = _settings(args)["cache-dir"]
    result = Cache(cache_dir).prune(args.max_size, None if args.unused_days is None else args.unused_days * 86400)
    print(f"{cache_dir}: removed {result.removed} artifacts ({result.freed_bytes / 2 ** 30:.2f} GiB), "
          f"kept {result.kept} ({result.kept_bytes / 2 ** 30:.2f} GiB)")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from quantverdict.perf import gpu_lane
    from quantverdict.capabilities import detect
    from quantverdict.run.pipeline import Pipeline

    caps = detect()
    if caps.gpu is None:
        raise HarnessError("bench measures the GPU lane and needs a CUDA GPU; none found")
    module = _pipeline(args).store.module(args.model)
    figures: dict = {"gpu": caps.to_dict()["gpu"], "model": args.model,
                     "lane": gpu_lane.resnet_lane(module, [int(b) for b in args.batches], args.precisions,
                                                  args.peak_tflops, args.compile),
                     "overhead": {b: gpu_lane.harness_overhead(module, (int(b), 3, 224, 224)) for b in args.batches}}
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
    if args.out:
        atomic_write_bytes(args.out, json.dumps(figures, indent=1).encode())
    return 0


def _compare_timings(args: argparse.Namespace) -> int:
    from quantverdict.perf.timing_compare import compare_files

    result = compare_files(args.base, args.current, args.ratio, args.alpha)
    for change in result["changes"]:
        print(change.describe())
    for label in ("only_in_base", "only_in_current"):
        for name in result[label]:
            print(f"{label.replace('_', ' ')}: {name}")
    regressed = [c for c in result["changes"] if c.verdict == "regressed"]
    print(f"{len(regressed)} regression(s) of {len(result['changes'])} benchmark(s) "
          f"(needs ×{args.ratio:g} and p < {args.alpha:g})")
    return 1 if regressed else 0


def _history(args: argparse.Namespace) -> int:
    import time as clock
    from collections import Counter

    from quantverdict.report.history import judge_history, load_policies

    start = clock.perf_counter()
    verdicts = judge_history(args.db, load_policies(args.history_policy, args.profile))
    for verdict in verdicts:
        if args.all or verdict.verdict.state not in ("stable", "insufficient data"):
            print(verdict.describe())
    counts = Counter(v.verdict.state for v in verdicts)
    print(f"{len(verdicts)} series ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))}) "
          f"judged in {clock.perf_counter() - start:.1f} s, profile {args.profile}")
    if args.page:
        from quantverdict.report.history_page import history_section
        from quantverdict.report.render import page

        body = [f"<h1>Run history {html.escape(str(args.db))}</h1>",
                history_section(args.db, verdicts, draw_all=args.all, profile=args.profile)]
        atomic_write_bytes(args.page, page("Run history", body).encode())
        print(f"page: {args.page}")
    return 1 if counts["regression"] else 0


def _merge(args: argparse.Namespace) -> int:
    from quantverdict.report.load import load_record
    from quantverdict.report.merge import merge_records

    merged = merge_records([load_record(path) for path in args.shards], [str(p) for p in args.shards])
    atomic_write_bytes(args.out, json.dumps(merged, indent=1, default=str).encode())
    summary = ", ".join(f"{count} {status}" for status, count in sorted(merged["summary"].items()))
    print(f"merged {len(args.shards)} shard(s): {len(merged['cases'])} cases ({summary}) → {args.out}")
    return 0


def _mutate(args: argparse.Namespace) -> int:
    from quantverdict.judge.mutations import load_catalogue
    from quantverdict.run.mutate import MIN_ACCURACY_COST, MIN_SNR_COST_DB, run_campaign
    from quantverdict.run.pipeline import Pipeline

    pipeline = _pipeline(args)
    manifest = _settings(args)["manifest"]
    models = args.models or [n for n in pipeline.models.names() if not pipeline.models.get(n).slow]
    campaign = run_campaign(pipeline, models, load_catalogue(args.catalogue), args.reruns, policy=args.gate_policy,
                            fresh_pipeline=lambda cache: Pipeline(cache, manifest=manifest))
    print(f"runner class: {pipeline.caps.runner_class}; significant = costs ≥ {MIN_SNR_COST_DB:g} dB SNR or "
          f"≥ {MIN_ACCURACY_COST:g} point of accuracy (on the graph's semantics)")
    print(f"{'defect kind':<26} {'planted':>7} {'signif.':>7} {'tolerance':>9} {'baseline':>9} {'any':>6}   "
          "(fraction of significant caught; of all planted in brackets)")
    for row in campaign.table():
        cells = [f"{_fmt(row[c], '.2f', 4)} ({row[c + '_all']:.2f})" for c in ("tolerance", "baseline", "any")]
        print(f"{row['kind']:<26} {row['planted']:>7} {row['significant']:>7} {' '.join(cells)}")
    power, alone = campaign.power(), campaign.power("tolerance")
    print(f"\ncaught: {_fmt(power, '.3f', 5)} of significant defects by the tolerance table or the baseline "
          f"rules; {_fmt(alone, '.3f', 5)} by the tolerance table alone")
    print(f"false alarms: {len(campaign.false_alarms)} in {campaign.clean_reruns} clean rerun(s) of "
          f"{len(models)} model(s)" + "".join(f"\n  {line}" for line in campaign.false_alarms))
    for item in campaign.planted:
        if item.significant and "any" not in item.caught_by:
            print(f"missed: {item.defect} on {item.model}-{item.precision} (SNR cost {item.snr_cost_db:.1f} dB)")
    if args.out:
        atomic_write_bytes(args.out, json.dumps(campaign.to_dict(), indent=1, default=str).encode())
    return 0 if (power is None or power >= args.min_power) and not campaign.false_alarms else 1


def _models(args: argparse.Namespace) -> int:
    pipeline = _pipeline(args)
    for name in pipeline.models.names():
        spec = pipeline.models.get(name)
        shapes = ", ".join(f"{i.name}{list(i.shape)}" for i in spec.inputs)
        print(f"{name:<20} {spec.task:<15} {shapes}")
    return 0


def _env(args: argparse.Namespace) -> int:
    from quantverdict.capabilities import detect

    print(json.dumps({**detect().to_dict(), "precisions": detect().precision_matrix()}, indent=1))
    return 0
