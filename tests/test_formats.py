"""Which 8-bit format suits a tensor: rounding SNR in INT8 and FP8 E4M3, against each format's own
arithmetic (quantverdict/judge/formats.py)."""
import json
import math

import numpy as np
import onnx
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

from quantverdict.judge.formats import format_fit, format_recipes, rounding_snr, snr_db, summarize
from quantverdict.precision.exposing import as_written_session
from quantverdict.precision.grids import FP8_E4M3, INT8


def _int8_expected_db(values: np.ndarray, step: float) -> float:
    """Uniform rounding noise of a step Δ: Δ²/12 per value."""
    return 10 * math.log10(np.mean(np.square(values, dtype=np.float64)) / (step * step / 12))


def _e4m3_expected_db(values: np.ndarray, scale: float) -> float:
    """E4M3 with 3 mantissa bits: a value in [2^k, 2^(k+1)) rounds on a step of 2^(k-3), below 2^-6
    (subnormal) on 2^-9; each value's noise is its step²/12 (derived here, not read from ml_dtypes)."""
    scaled = np.abs(values.astype(np.float64)) / scale
    octave = np.floor(np.log2(np.maximum(scaled, 2.0 ** -6)))
    step = 2.0 ** (octave - 3)
    noise = np.mean(step * step / 12) * scale * scale
    return 10 * math.log10(np.mean(np.square(values, dtype=np.float64)) / noise)


def test_on_values_that_fill_their_range_int8_rounds_sixteen_db_finer_than_e4m3():
    """Uniform on [0, 6] (a ReLU6 activation): INT8 48.1 dB, E4M3 31.9 dB, each its grid's arithmetic."""
    values = np.random.default_rng(0).uniform(0, 6, 1 << 20).astype(np.float32)
    amax = float(values.max())
    int8 = snr_db(*rounding_snr(values, amax / 127, INT8))
    fp8 = snr_db(*rounding_snr(values, amax / 448, FP8_E4M3))
    assert abs(int8 - _int8_expected_db(values, amax / 127)) < 0.05
    assert abs(fp8 - _e4m3_expected_db(values, amax / 448)) < 0.05
    assert abs(int8 - 10 * math.log10(4 * 127 ** 2)) < 0.05 and int8 - fp8 > 15


def test_where_outliers_set_the_range_e4m3_rounds_finer():
    """Gaussian values with one in a thousand of magnitude 20 to 40: the max-calibrated INT8 step (about
    40/127) is coarse for the bulk, while E4M3's relative step does not care where the outliers put the scale."""
    rng = np.random.default_rng(1)
    values = rng.standard_normal(1 << 20).astype(np.float32)
    count = values.size // 1000
    values[rng.choice(values.size, count, replace=False)] = rng.uniform(20, 40, count) * rng.choice([-1, 1], count)
    amax = float(np.abs(values).max())
    int8 = snr_db(*rounding_snr(values, amax / 127, INT8))
    fp8 = snr_db(*rounding_snr(values, amax / 448, FP8_E4M3))
    assert abs(int8 - _int8_expected_db(values, amax / 127)) < 0.1
    assert abs(fp8 - _e4m3_expected_db(values, amax / 448)) < 0.1
    assert fp8 - int8 > 5


@given(arrays(np.float32, st.integers(1, 256),
              elements=st.floats(2.0 ** -6, 448, width=32) | st.floats(-448, -(2.0 ** -6), width=32)))
def test_e4m3_rounds_no_value_in_its_normal_range_by_more_than_a_sixteenth(values):
    """3 mantissa bits: every error is at most half a step, 1/16 of the value, so the SNR of any tensor
    inside E4M3's normal range is at least 10·log10(256) = 24.1 dB, wherever the values lie."""
    assert snr_db(*rounding_snr(values, 1.0, FP8_E4M3)) >= 10 * math.log10(256) - 1e-9


@given(arrays(np.float32, st.integers(1, 256), elements=st.floats(-127, 127, width=32)))
def test_int8_rounds_no_value_in_range_by_more_than_half_a_step(values):
    signal, noise = rounding_snr(values, 1.0, INT8)
    assert noise <= values.size * 0.25 + 1e-9 and signal == np.sum(np.square(values, dtype=np.float64))


def test_format_fit_measures_what_the_recipes_graph_does(qv_pipeline):
    """On a real model (dwblock: uniform input, a ReLU6 depthwise block), the INT8 figures are the
    INT8 recipe graph's own rounding, run by ONNX Runtime as written: each activation's Q→DQ output
    against its FP32 value, each weight's dequantized initializer against FP32's; FP8 leaves the
    depthwise and stem inputs to the layers TensorRT runs in FP8."""
    store = qv_pipeline.store
    fits = {fit.tensor: fit for fit in format_fit(store, "dwblock")}
    recipe = format_recipes(store.models.get("dwblock").recipe)["int8"]
    graph = onnx.load(str(store.precision_onnx("dwblock", recipe)))
    activations = [t for t, fit in fits.items() if fit.kind == "activation"]
    assert activations and all("int8" in fits[t].quantized_by for t in activations)
    fp32_graph = onnx.load(str(store.fp32_onnx("dwblock")))
    fp32_graph.graph.output.extend(onnx.ValueInfoProto(name=t) for t in activations)
    fp32_session = as_written_session(fp32_graph)
    qdq = {t: _qdq_pair(graph, t) for t in activations}
    energy = {t: [0.0, 0.0] for t in activations}
    for batch in store.calibration_batches("dwblock"):
        for t, value in zip(activations, fp32_session.run(activations, batch)):
            restored = qdq[t].run(None, {"x": value})[0]
            energy[t][0] += float(np.sum(np.square(value, dtype=np.float64)))
            energy[t][1] += float(np.sum(np.square(value - restored, dtype=np.float64)))
    for t in activations:
        assert abs(fits[t].snr_db["int8"] - snr_db(*energy[t])) < 1e-3, t
    initializers = {i.name: onnx.numpy_helper.to_array(i) for i in graph.graph.initializer}
    fp32 = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(str(store.fp32_onnx("dwblock"))).graph.initializer}
    weights = [t for t, fit in fits.items() if fit.kind == "weight"]
    assert len(weights) == 4
    for w in weights:
        scale = initializers[f"{w}_scale"]
        restored = initializers[f"{w}_quantized"].astype(np.float32) * scale.reshape((-1,) + (1,) * (fp32[w].ndim - 1))
        noise = float(np.sum(np.square(fp32[w] - restored, dtype=np.float64)))
        assert abs(fits[w].snr_db["int8"] - snr_db(float(np.sum(np.square(fp32[w], dtype=np.float64))), noise)) < 1e-3
    image = fits["input"]  # synthetic calibration images: uniform on the input's range
    assert image.quantized_by == ["int8"]  # the 3-channel stem has no FP8 kernel
    assert abs(image.snr_db["int8"] - 10 * math.log10(4 * 127 ** 2)) < 0.3
    assert abs(image.snr_db["fp8"] - 31.9) < 0.3
    assert sum("fp8" in fit.quantized_by for fit in fits.values() if fit.kind == "weight") == 2


def _qdq_pair(graph: onnx.ModelProto, tensor: str):
    """The recipe graph's own QuantizeLinear → DequantizeLinear on ``tensor`` (its scale and zero point),
    alone, as an ONNX Runtime session over FP32 values."""
    from onnx import TensorProto, helper

    from quantverdict.export.compat import make_model, opset_of

    names = {f"{tensor}_scale", f"{tensor}_zero_point"}
    constants = [i for i in graph.graph.initializer if i.name in names]
    pair = [n for n in graph.graph.node if n.name in (f"{tensor}_QuantizeLinear", f"{tensor}_DequantizeLinear")]
    pair[0].input[0], pair[-1].output[0] = "x", "y"
    model = make_model(helper.make_graph(
        pair, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], constants), opset=opset_of(graph))
    return as_written_session(model)


def test_the_formats_command_prints_and_writes_every_tensor(tmp_path, qv_pipeline, capsys):
    from quantverdict.run.cli import main

    out = tmp_path / "formats.json"
    assert main(["formats", "dwblock", "--cache-dir", str(qv_pipeline.store.cache.root), "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    fits = format_fit(qv_pipeline.store, "dwblock")
    assert [row["tensor"] for row in document["tensors"]] == [fit.tensor for fit in fits]
    assert document["summary"] == json.loads(json.dumps(summarize(fits)))
    assert "finer in int8" in capsys.readouterr().out


def test_the_summary_names_each_formats_coarsest_tensors_which_a_median_hides():
    from quantverdict.judge.formats import WORST, TensorFit, summarize

    fits = [TensorFit(f"t{i}", "activation", f"layer{i}", {"int8": 40.0 + i, "fp8": 31.9}, ["int8", "fp8"])
            for i in range(12)]
    fits += [TensorFit("ffn_mul", "activation", "ffn", {"int8": 7.9, "fp8": 31.9}, ["int8", "fp8"])]  # one outlier-set range
    summary = summarize(fits)["activation"]
    assert summary["median_snr_db"]["int8"] > 40  # the median says INT8 is fine
    assert [w["tensor"] for w in summary["worst"]["int8"]] == ["ffn_mul", "t0", "t1", "t2", "t3"][:WORST]
    assert summary["worst"]["int8"][0]["snr_db"] == {"int8": 7.9, "fp8": 31.9}
