"""ONNX export: named I/O, a working dynamic batch, and ONNX Runtime ≡ PyTorch in FP32."""
import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from quantverdict.export import load_onnx

MODELS = ["mlp", "cnn", "resblock", "dwblock", "transformer-block", "digits-cnn", "mobilenetv3", "resnet18"]


@pytest.mark.fp32
@pytest.mark.onnxruntime
@pytest.mark.parametrize("name", MODELS)
def test_onnxruntime_matches_torch_at_another_batch_size(name, qv_pipeline):
    spec = qv_pipeline.models.get(name)
    path = qv_pipeline.store.fp32_onnx(name)
    model = load_onnx(path)
    assert [i.name for i in model.graph.input] == [i.name for i in spec.inputs]
    assert [o.name for o in model.graph.output] == list(spec.outputs)
    batch = spec.inputs[0].shape[0] + 3  # not the batch size the export traced
    feed = spec.sample_batches(1, seed=11, batch=batch)[0]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, feed)[0]
    with torch.no_grad():
        want = qv_pipeline.store.module(name)(*[torch.from_numpy(feed[i.name]) for i in spec.inputs]).numpy()
    assert got.shape == want.shape and got.shape[0] == batch
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_export_is_cached_by_content(qv_pipeline, tmp_path):
    from quantverdict.cache import Cache
    from quantverdict.export import export_onnx

    cache = Cache(tmp_path)
    spec = qv_pipeline.models.get("cnn")
    module = spec.build().eval()
    first = export_onnx(spec, module, cache)
    assert export_onnx(spec, module, cache) == first
    assert (cache.stats["onnx.miss"], cache.stats["onnx.hit"]) == (1, 1)
    with torch.no_grad():
        module[0].weight[0, 0, 0, 0] += 1.0  # one weight changes → a new export
    assert export_onnx(spec, module, cache) != first
    assert cache.stats["onnx.miss"] == 2
    assert onnx.load(str(first)).opset_import[0].version == 19
