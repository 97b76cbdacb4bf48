"""Outputs joined sample by sample: a recurrent layer's state ``[layers, batch, hidden]`` is judged by sample, as a
batch-first output is, by every runtime and in the timed loop's check."""
import numpy as np
import pytest

from quantverdict.run.cases import Case
from quantverdict.run.pipeline import Pipeline
from quantverdict.backends.samples import joined, sample_axis
from user_repo import written

TALKER = """import torch
from torch import nn


class Talker(nn.Module):
    '''A 2-layer LSTM that returns an embedding of its last step and its last hidden state, [2, batch, 24]
    (PyTorch's layout, and ONNX's LSTM's Y_h).'''

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True)
        self.head = nn.Linear(24, 8)

    def forward(self, frames):
        steps, (state, _) = self.lstm(frames)
        return self.head(steps[:, -1]), state


def net():
    return Talker().eval()
"""
MANIFEST = """models:
  - name: talker
    build: talker:net
    build_files: []
    inputs: [{name: frames, shape: [4, 10, 16]}]
    outputs: [embedding, state]
    calibration: synthetic
    recipe: {int8: {calibration: max, recurrent: dynamic}}
"""


@pytest.mark.parametrize("shapes, sizes, axis", [
    ([(4, 10)], [4], 0),  # batch first
    ([(2, 4, 24), (2, 4, 24)], [4, 4], 1),  # a recurrent state
    ([(2, 1, 24)], [1], 1),  # one sample a batch: the layers' axis is not it
    ([(2, 2, 24)], [2], 0),  # as many layers as samples: the first, as before
    ([(10, 4, 3, 4)], [4], 1),  # sequence first: the first axis with the batch's samples
    ([(7, 3)], [4], 0),  # no axis with them (a sum over the batch): the first, as before
    ([(2, 4, 24), (2, 3, 24)], [4, 4], 0),  # not the batch's samples in every batch
    ([(3,)], [1], 0),  # scalar inputs only: one sample a batch
    ([(5, 3), (2, 3)], [3, 3], 0),  # NonMaxSuppression's [selected, 3]: a count that varies, joined as before
])
def test_the_sample_axis_is_the_first_unless_another_holds_the_batchs_samples(shapes, sizes, axis):
    assert sample_axis(shapes, sizes) == axis


def test_joined_outputs_put_each_batchs_samples_first_in_order():
    batches = [{"x": np.zeros((3, 5))}, {"x": np.zeros((3, 5))}]
    state = [np.arange(18).reshape(2, 3, 3) + 100 * b for b in range(2)]  # [layers, samples, hidden]
    out = joined([{"state": s, "scalar": np.float32(b)} for b, s in enumerate(state)], batches)
    assert out["state"].shape == (6, 2, 3) and out["scalar"].shape == (2,)
    for b in range(2):
        for sample in range(3):
            assert np.array_equal(out["state"][3 * b + sample], state[b][:, sample])


@pytest.fixture
def talker(tmp_path, monkeypatch, qv_pipeline):
    written(tmp_path, monkeypatch, {"talker.py": TALKER, "models.yaml": MANIFEST})
    return Pipeline(qv_pipeline.cache.root, manifest=tmp_path / "models.yaml", timing=True)


@pytest.mark.int8
def test_a_recurrent_state_is_judged_by_sample(talker):
    """Each sample's row of the joined FP32 state is PyTorch's state of that sample alone (not a layer of another
    batch), and the INT8 verdict, its recipe's and its timed loop's check count the evaluation set's samples."""
    import torch

    from talker import net

    reference, batches = talker.store.reference("talker"), talker.store.eval_batches("talker")
    frames = np.concatenate([batch["frames"] for batch in batches])
    assert reference["state"].shape == (len(frames), 2, 24)
    with torch.no_grad():
        for index in (0, 5, len(frames) - 1):
            _, alone = net()(torch.from_numpy(frames[index:index + 1]))
            assert np.allclose(reference["state"][index], alone[:, 0].numpy(), atol=1e-5)
    result = talker.run(Case("talker", "int8", "onnxruntime"))
    assert result.status in ("passed", "failed"), result.message
    for verdict in (result.metrics["metrics"], result.metrics["recipe"]["metrics"]):
        assert verdict["state"]["samples"] == verdict["embedding"]["samples"] == len(frames)
    timed = result.metrics["timed_outputs"]
    assert timed["identical"] == timed["samples"] > 0, timed  # the timed calls' state laid out as judged


READER = """import torch
from torch import nn


class Reader(nn.Module):
    '''A CTC reader in torch's layout: features [batch, 16, 20] in, per-position log-probabilities out as
    [positions, batch, symbols] (what nn.CTCLoss takes).'''

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(16, 32)
        self.head = nn.Linear(32, 12)

    def forward(self, features):
        steps, _ = self.lstm(features.permute(2, 0, 1))
        return self.head(steps).log_softmax(-1)


def net():
    return Reader().eval()
"""


@pytest.mark.int8
@pytest.mark.parametrize("declared", ["{blank: 0}", "{blank: 0, batch_axis: 1}"])  # an older manifest's axis
def test_a_ctc_output_in_torchs_layout_is_decoded_sample_by_sample(tmp_path, monkeypatch, qv_pipeline, declared):
    """[positions, batch, symbols] joined by sample: each sample's FP32 decoding is the reader's own on that sample
    alone, and the verdict decodes the evaluation set's samples (it decoded each position of each batch as a sample,
    or with ``batch_axis: 1`` the batches' positions end to end as one sample each)."""
    import torch

    from quantverdict.judge.sequences import decode

    written(tmp_path, monkeypatch, {"reader.py": READER, "models.yaml": """models:
  - name: reader
    build: reader:net
    build_files: []
    inputs: [{name: features, shape: [4, 16, 20]}]
    outputs: [logits]
    sequences: {logits: %s}
    calibration: synthetic
    recipe: {int8: {calibration: max, recurrent: dynamic}}
""" % declared})
    pipeline = Pipeline(qv_pipeline.cache.root, manifest=tmp_path / "models.yaml")
    from reader import net

    reference = pipeline.store.reference("reader")["logits"]
    features = np.concatenate([batch["features"] for batch in pipeline.store.eval_batches("reader")])
    assert reference.shape == (len(features), 20, 12)
    with torch.no_grad():
        for index in (0, 6, len(features) - 1):
            alone = net()(torch.from_numpy(features[index:index + 1]))[:, 0].numpy()
            assert decode(reference[index], 0) == decode(alone, 0)
    result = pipeline.run(Case("reader", "int8", "onnxruntime"))
    assert result.status in ("passed", "failed"), result.message
    assert result.metrics["metrics"]["logits"]["sequence_samples"] == len(features)
