"""The GPU lane: PyTorch on CUDA timed by ``quantverdict.perf.bench`` (throughput per precision, FP8 linear
layers through ``torch._scaled_mm``, the harness's own overhead). ``python -m quantverdict bench``.

It measures what people deploy: image models in ``channels_last`` (cuDNN's fast NHWC kernels),
ratios to FP32 from CUDA-graph replay (launch gaps removed, so batch 1 is stable), and beside
each of its numbers a plain hand-written eager loop's on the same model and input.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np

from quantverdict.perf.bench import Ratio, Timing, interleaved_ratio, time_call, time_cuda

DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
ROTATE = 3  # input buffers cycled through
MIN_COSINE = 0.9  # against FP32: below it the configuration is broken, not fast


def model_flops(module: Any, x: Any) -> int:
    """Floating-point operations of one forward pass (PyTorch's FLOP counter: 2 per multiply-add)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(x)
    return int(counter.get_total_flops())


def _prepared(module: Any, precision: str, shape: tuple[int, ...], compile: bool = False) -> tuple[Any, list[Any]]:
    """The module and rotated inputs on CUDA in ``precision``; image batches in channels_last."""
    import torch

    torch.backends.cudnn.benchmark = True  # autotuned convolutions, as deployed engines are
    dtype = getattr(torch, DTYPES[precision])
    layout = torch.channels_last if len(shape) == 4 else torch.contiguous_format
    model = copy.deepcopy(module).to("cuda", dtype).to(memory_format=layout).eval()  # the caller's stays FP32
    generator = torch.Generator(device="cuda").manual_seed(0)
    inputs = [torch.rand(shape, device="cuda", generator=generator).mul_(4).sub_(2).to(dtype)
              .contiguous(memory_format=layout) for _ in range(ROTATE)]
    return (torch.compile(model) if compile else model), inputs


def hand_loop(module: Any, precision: str, shape: tuple[int, ...], repeats: int = 50) -> Timing:
    """What a person would write: warm up, then one pair of CUDA events around a plain eager loop."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    model, inputs = _prepared(module, precision, shape)
    with torch.no_grad():
        for _ in range(10):
            model(inputs[0])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(repeats):
            model(inputs[i % ROTATE])
        end.record()
        end.synchronize()
    per_call = start.elapsed_time(end) / repeats
    return Timing(per_call, per_call, per_call, per_call, repeats, shape[0] / (per_call / 1e3))


def torch_cuda_timing(module: Any, precision: str, shape: tuple[int, ...], graph: bool = False,
                      compile: bool = False) -> Timing:
    """Compute-only time of the module in ``precision``, its output checked against FP32 on the same
    input first, and outputs sampled inside the timed loop checked against that output (MLPerf
    TEST01), so a broken configuration cannot look fast."""
    import torch

    from quantverdict.judge.timed import judge_timed_outputs
    from quantverdict.judge.tolerances import Tolerance

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model32, inputs32 = _prepared(module, "fp32", shape)
    with torch.no_grad():
        reference = model32(inputs32[0]).double()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    model, inputs = _prepared(module, precision, shape, compile)
    with torch.no_grad():
        out = model(inputs[0]).double()
        cosine = float(torch.nn.functional.cosine_similarity(out.flatten(), reference.flatten(), dim=0))
        if not cosine >= MIN_COSINE:  # NaN fails too
            raise RuntimeError(f"{precision}: output cosine {cosine:.3f} against FP32: not timing a broken model")
        timing = time_cuda(lambda x: model(x), inputs, items=shape[0], graph=graph)
    host = lambda t: {"output": t.double().cpu().numpy()}  # noqa: E731
    timed = judge_timed_outputs(host(out), [host(t) for t in timing.sampled], host(reference),
                                Tolerance(min_cosine=MIN_COSINE))
    if not timed.passed:
        raise RuntimeError(f"{precision}{' (CUDA graph)' if graph else ''}: {timed.explain()}")
    return timing


def fp8_linear_stack(layers: int = 8, width: int = 8192, tokens: int = 8192) -> dict[str, Any]:
    """A transformer-sized stack of Linear layers: FP8 E4M3 (``torch._scaled_mm``) vs BF16, per layer
    per-tensor scales (amax / 448), on the same weights and input."""
    import torch

    generator = torch.Generator(device="cuda").manual_seed(0)
    weights = [torch.randn(width, width, device="cuda", generator=generator) / width ** 0.5 for _ in range(layers)]
    x = torch.randn(tokens, width, device="cuda", generator=generator)
    bf16_weights = [w.to(torch.bfloat16) for w in weights]
    scales = [(w.abs().max() / 448).float() for w in weights]
    fp8_weights = [(w / s).to(torch.float8_e4m3fn).t() for w, s in zip(weights, scales)]  # column-major operand

    def bf16(h: Any) -> Any:
        for w in bf16_weights:
            h = h @ w.t()
        return h

    def fp8(h: Any) -> Any:
        for w, s in zip(fp8_weights, scales):
            hs = (h.abs().max() / 448).float()
            h = torch._scaled_mm((h / hs).to(torch.float8_e4m3fn), w, scale_a=hs, scale_b=s, out_dtype=torch.bfloat16)
        return h

    x16 = x.to(torch.bfloat16)
    with torch.no_grad():
        reference, got = bf16(x16).float(), fp8(x16).float()
        cosine = float(torch.nn.functional.cosine_similarity(reference.flatten(), got.flatten(), dim=0))
        flops = 2 * tokens * width * width * layers
        ratio = interleaved_ratio(lambda: time_cuda(bf16, [x16], tokens, warmup=3, repeats=10),
                                  lambda: time_cuda(fp8, [x16], tokens, warmup=3, repeats=10))
        bf16_time = time_cuda(bf16, [x16], tokens, warmup=3, repeats=10)
        fp8_time = time_cuda(fp8, [x16], tokens, warmup=3, repeats=10)
    return {"layers": layers, "width": width, "tokens": tokens, "cosine_fp8_vs_bf16": cosine,
            "bf16_tflops": flops / bf16_time.median_ms / 1e9, "fp8_tflops": flops / fp8_time.median_ms / 1e9,
            "fp8_speedup": ratio.__dict__}


def harness_overhead(module: Any, shape: tuple[int, ...], rounds: int = 5) -> dict[str, float]:
    """The same FP32 forward timed three ways: a hand-written loop (:func:`hand_loop`), ``time_cuda``, and
    the harness's torch runner (host arrays in and out: copies included)."""
    import torch

    from quantverdict.backends.pyt import TorchRunner
    from quantverdict.models.spec import InputSpec, ModelSpec

    model, inputs = _prepared(module, "fp32", shape)
    with torch.no_grad():
        pairs = [(hand_loop(module, "fp32", shape).median_ms,
                  time_cuda(lambda x: model(x), inputs, items=shape[0]).median_ms) for _ in range(rounds)]
        agreement = [ours / hand for hand, ours in pairs]
        hand, harness_events = float(np.median([h for h, _ in pairs])), float(np.median([o for _, o in pairs]))
    spec = ModelSpec("overhead", [InputSpec("input", shape)], ["output"], build=lambda: module)
    batch = {"input": inputs[0].float().cpu().numpy()}
    with TorchRunner(module, spec, "fp32", "cuda") as runner:
        with_copies = time_call(lambda: runner.infer(batch), items=shape[0], synchronize=torch.cuda.synchronize).median_ms
    return {"hand_loop_ms": hand, "time_cuda_ms": harness_events, "agreement": float(np.median(agreement)),
            "agreement_low": min(agreement), "agreement_high": max(agreement), "runner_with_copies_ms": with_copies}


def lane(module: Any, sample: tuple[int, ...], batches: list[int], precisions: list[str], peak_tflops: float,
         compile: bool = False) -> list[dict[str, Any]]:
    """Per precision and batch of inputs shaped ``sample`` (one input's shape without its batch axis): eager and
    CUDA-graph time (channels_last for images), a hand loop's time beside them, and the ratio to FP32 from graph
    replay, measured interleaved (with its spread)."""
    import torch

    rows = []
    for batch in batches:
        shape = (batch, *sample)
        flops = model_flops(module.float().cuda(), torch.rand(shape, device="cuda"))
        for precision in precisions:
            timing = torch_cuda_timing(module, precision, shape, compile=compile)
            replayed = torch_cuda_timing(module, precision, shape, graph=True, compile=compile)
            hands: list[Timing] = []  # the hand loop's rounds, reported as its time too

            def hand(p: str = precision) -> Timing:
                hands.append(hand_loop(module, p, shape))
                return hands[-1]

            ours = lambda p=precision: torch_cuda_timing(module, p, shape, compile=compile)  # noqa: E731
            agreement = interleaved_ratio(hand, ours, rounds=3)  # harness speed / hand loop's: 1 = same time
            ratio: Ratio = interleaved_ratio(lambda: torch_cuda_timing(module, "fp32", shape, graph=True),
                                             lambda p=precision: torch_cuda_timing(module, p, shape, graph=True),
                                             rounds=3)
            rows.append({"batch": batch, "precision": precision, "median_ms": timing.median_ms,
                         "images_per_s": timing.items_per_s,
                         "hand_loop_ms": float(np.median([h.median_ms for h in hands])),
                         "vs_hand_loop": agreement.__dict__,
                         "vs_fp32": ratio.__dict__, "cuda_graph_median_ms": replayed.median_ms,
                         "tflops": flops / timing.median_ms / 1e9,
                         "fraction_of_peak": flops / timing.median_ms / 1e9 / peak_tflops,
                         "layout": "channels_last", "compiled": compile})
    return rows


def transformer_block_speedup(tokens: int = 8192, dim: int = 4096, rounds: int = 5) -> dict[str, Any]:
    """A transformer-sized block (LayerNorm, QKV and output projections around scaled-dot-product
    attention, a 4× GELU MLP) in BF16, then with every Linear on FP8 ``torch._scaled_mm`` (per-tensor
    and row-wise scales) and on INT8 ``torch._int_mm``, activation scales calibrated by the harness's
    max calibrator on another batch; each variant's ratio to BF16 from CUDA-graph replay, interleaved,
    and its output's cosine against BF16's."""
    import torch
    from torch import nn

    from quantverdict.backends.torch_quant import linear_input_amax, quantize_linears
    from quantverdict.models.spec import InputSpec, ModelSpec
    from quantverdict.precision.calibrators import Calibrator

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, 32, dim // 32).permute(2, 0, 3, 1, 4)
            attention = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attention.transpose(1, 2).reshape(b, t, dim))
            return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))

    torch.manual_seed(0)
    block = Block().cuda().to(torch.bfloat16).eval()
    shape = (tokens // 2048, 2048, dim)
    generator = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(shape, device="cuda", generator=generator, dtype=torch.bfloat16)
    calibration = [{"x": torch.randn(shape, device="cuda", generator=generator).cpu().numpy()}]
    spec = ModelSpec("block", [InputSpec("x", shape)], ["y"], build=lambda: block)
    with torch.no_grad():
        amax = linear_input_amax(block.float(), calibration, spec, Calibrator("max"), "cuda")
        block = block.to(torch.bfloat16)
        reference = block(x).float()
        variants = {mode: quantize_linears(block, amax, mode, torch.bfloat16, fused=True)[0]
                    for mode in ("fp8", "fp8-rowwise", "int8")}
        flops = 2 * tokens * dim * dim * (3 + 1 + 8)
        def timed(model: Any) -> Callable[[], Timing]:
            return lambda: time_cuda(lambda h: model(h), [x], tokens, warmup=3, repeats=20, graph=True)

        out: dict[str, Any] = {"tokens": tokens, "dim": dim, "bf16_ms": timed(block)().median_ms}
        out["bf16_tflops"] = flops / out["bf16_ms"] / 1e9
        for mode, model in variants.items():
            got = model(x).float()
            cosine = float(torch.nn.functional.cosine_similarity(got.flatten(), reference.flatten(), dim=0))
            ratio = interleaved_ratio(timed(block), timed(model), rounds)
            out[mode] = {"cosine_vs_bf16": cosine, "speedup_vs_bf16": ratio.__dict__}
    return out
