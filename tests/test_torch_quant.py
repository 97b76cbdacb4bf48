"""Quantized GEMMs executed for real on the GPU (torch._scaled_mm FP8, torch._int_mm INT8): each
layer computes its Q/DQ semantics, and the transformer models' INT8/FP8 cases run and pass."""
import pytest

from quantverdict.capabilities import GPU, Capabilities, detect
from quantverdict.models import BUILTIN
from quantverdict.run.cases import Case

SPECS = {spec.name: spec for spec in BUILTIN}
CUDA = detect().gpu
needs_fp8 = pytest.mark.skipif(CUDA is None or CUDA.compute_capability < (8, 9),
                               reason="torch._scaled_mm in FP8 needs an NVIDIA GPU of compute capability ≥ 8.9; "
                                      f"{'none found' if CUDA is None else CUDA.name + ' is ' + CUDA.cc}")


def test_each_precision_names_its_kernel_and_the_capability_it_needs():
    from quantverdict.backends.torch_quant import TorchQuantBackend

    backend, spec = TorchQuantBackend(), SPECS["transformer-block"]
    ampere, hopper = Capabilities(GPU("A100", (8, 0)), {"torch": "2"}), Capabilities(GPU("H100", (9, 0)), {"torch": "2"})
    assert backend.requirement(spec, "int8", ampere) is None and backend.requirement(spec, "fp8", hopper) is None
    assert backend.requirement(spec, "fp8", ampere) == ("fp8 on torch_quant uses torch._scaled_mm in FP8, which needs "
                                                        "compute capability ≥ 8.9; this GPU (A100) is 8.0")
    assert "on an NVIDIA GPU; none found" in backend.requirement(spec, "int8", Capabilities(None, {"torch": "2"}))
    assert not backend.runs_recipe_graph  # its own layer selection: judged against FP32, not the graph


@needs_fp8
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["int8", "fp8", "fp8-rowwise"])
def test_a_quantized_linear_computes_its_qdq_semantics(mode):
    """The kernel's output equals the layer's Q/DQ semantics (quantize, dequantize, matmul in FP64) up to
    accumulation, for shapes the tensor cores need padded (K, N not multiples of 16, few rows): INT8
    accumulates exactly in INT32; Hopper's FP8 tensor cores accumulate with fewer bits than FP32
    (1.3e-4 measured here on H100 for K = 80); row-wise scaling returns BF16 (2^-8)."""
    import torch

    from quantverdict.backends.torch_quant import FP8_MAX, INT8_MAX, quant_linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(72, 40).cuda()
    x = torch.randn(5, 3, 72, device="cuda")
    amax = float(x.abs().max()) * 0.8  # some inputs saturate, as calibrated ranges allow
    with torch.no_grad():
        got = quant_linear(linear, amax, mode)(x).double()
        bias = linear.bias.double()
    qmax, w = (INT8_MAX if mode == "int8" else FP8_MAX), linear.weight.double()
    rowwise = mode != "fp8"
    w = w.detach()
    w_scale = (w.abs().amax(1, keepdim=True) if rowwise else w.abs().amax()) / qmax
    x_scale = amax / qmax
    if mode == "int8":
        xq, wq = torch.round(x.double() / x_scale).clamp(-qmax, qmax), torch.round(w / w_scale).clamp(-qmax, qmax)
    else:
        cast = lambda t: t.clamp(-qmax, qmax).float().to(torch.float8_e4m3fn).double()  # noqa: E731
        xq, wq = cast(x.double() / x_scale), cast(w / w_scale)
    want = (xq * x_scale) @ (wq * w_scale).T + bias
    error = float((got - want).abs().max() / want.abs().max())
    bound = {"int8": 1e-5, "fp8": 1e-3, "fp8-rowwise": 2 ** -7}[mode]
    assert error < bound, f"{mode}: relative error {error:.3g} vs its Q/DQ semantics"


@needs_fp8
@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["int8", "fp8"])
@pytest.mark.parametrize("model", ["transformer-block", "mlp"])
def test_transformer_and_mlp_cases_run_their_linears_on_the_gpu(qv_pipeline, model, precision):
    result = qv_pipeline.run(Case(model, precision, "torch_quant"))
    assert result.status == "passed", result.message
    engine = result.metrics["engine"]
    assert engine["quantized_linears"] >= 2 and engine["mode"] == precision
    cosine = result.metrics["metrics"][SPECS[model].outputs[0]]["cosine"]
    assert cosine < 1.0 - 1e-7, "outputs identical to FP32: nothing was quantized"
    assert "fidelity" not in result.metrics  # its own layer selection: judged against FP32 only


@pytest.mark.parametrize("model, quantized, layers", [("mlp", 3, 3), ("transformer-block", 2, 4), ("cnn", 1, 3)])
def test_coverage_counts_the_layers_it_leaves_in_float(qv_pipeline, model, quantized, layers):
    """``nn.Linear`` only: convolutions and attention projections stay FP32, and are counted as such."""
    from quantverdict.backends.torch_quant import module_coverage

    coverage = module_coverage(qv_pipeline.store.module(model))
    assert (coverage["quantized"], coverage["layers"]) == (quantized, layers)
    assert len(coverage["quantized_layers"]) + len(coverage["float_layers"]) == layers


def test_a_case_that_would_run_most_layers_in_float_is_skipped_with_the_count(qv_pipeline):
    """A CNN on torch_quant would run its convolutions in FP32: not an INT8 verdict. The capability is stated
    (an H100), so the case reaches the coverage rule and stops there, before anything runs on a GPU."""
    from quantverdict.run.pipeline import Pipeline

    hopper = Capabilities(GPU("H100", (9, 0)), {"torch": "2"}, cpu=qv_pipeline.caps.cpu)
    result = Pipeline(qv_pipeline.cache.root, capabilities=hopper).run(Case("cnn", "int8", "torch_quant"))
    assert result.status == "skipped"
    assert result.message == ("torch_quant runs 1 of 3 weighted layers of 'cnn' in INT8 (80.3% of their weights); "
                              "2 Conv2d in float (no kernel: torch_quant quantizes the nn.Linear layers called through "
                              "their forward only): a verdict named INT8 would describe float layers")
    assert result.metrics["coverage"]["float_layers"] == sorted(result.metrics["coverage"]["float_layers"])
