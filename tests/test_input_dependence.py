"""A reference that does not depend on its input judges nothing: the case says so (a seeded ShuffleNet exported by
torch's dynamo exporter gave one set of logits for every input, and FP16, INT8 and FP8 all passed at cosine 1.00000)."""
import textwrap

import numpy as np
import pytest

from quantverdict.errors import ResolutionWarning
from quantverdict.judge.compare import compare
from quantverdict.judge.input_dependence import FP16_RESOLUTION, constant_outputs
from quantverdict.judge.tolerances import Tolerance
from quantverdict.run.pipeline import Case, Pipeline


def test_outputs_varying_less_than_fp16_resolves_are_noted_and_one_varying_output_is_enough():
    """Logits 1 + 1e-6 · noise over 8 samples: their varying part is -121 dB of their energy, under FP16's -66. With
    a varying output beside them (a detector's constant anchors beside its scores), nothing is noted; a varying part
    at FP16's resolution itself is not noted either."""
    noise = np.random.default_rng(0).normal(size=(8, 10))
    constant = {"logits": 1 + 1e-6 * noise}
    said = constant_outputs(constant)
    assert said is not None and "(logits)" in said and "across the 8 samples" in said and "part is -121 dB" in said
    assert constant_outputs({**constant, "scores": noise}) is None
    at_resolution = noise - noise.mean(0)
    at_resolution *= FP16_RESOLUTION * 1.01 * np.sqrt(np.sum(np.ones((8, 10))) / np.sum(at_resolution ** 2))
    assert constant_outputs({"logits": 1 + at_resolution}) is None
    assert "part is nothing" in constant_outputs({"logits": np.zeros((4, 3))})
    assert constant_outputs({"logits": np.ones((1, 10))}) is None  # one sample: no sample-to-sample part to read
    with pytest.warns(ResolutionWarning, match="barely depend on the inputs"):
        judged = compare(constant, {"logits": constant["logits"] + 1e-3}, Tolerance(min_cosine=0.99))
    assert judged.passed and judged.notes == [said]  # noted, its bounds judged as ever


NET = textwrap.dedent("""\
    import torch


    def blind():
        torch.manual_seed(0)
        net = torch.nn.Linear(6, 3)
        with torch.no_grad():
            net.weight.zero_()
        return net.eval()
    """)


def test_a_case_whose_model_ignores_its_input_keeps_the_note_in_its_record(tmp_path, monkeypatch):
    (tmp_path / "blindnets.py").write_text(NET)
    (tmp_path / "models.yaml").write_text("models:\n  - name: blind\n    build: blindnets:blind\n    build_files: []\n"
                                          "    inputs: [{name: x, shape: [4, 6]}]\n    outputs: [y]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    pipeline = Pipeline(tmp_path / "cache", manifest=tmp_path / "models.yaml")
    with pytest.warns(ResolutionWarning, match=r"the FP32 outputs \(y\) barely depend on the inputs"):
        result = pipeline.run(Case("blind", "fp16", "onnxruntime"))
    assert result.status == "passed", result.message
    assert any("barely depend on the inputs" in note for note in result.to_dict()["metrics"]["notes"])
