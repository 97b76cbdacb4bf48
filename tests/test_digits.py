"""The labeled task: a real accuracy, reproducible training, and an INT8 delta that is measured."""
import numpy as np
import pytest
import torch

from quantverdict.models import digits
from quantverdict.run.pipeline import Case


def test_training_is_deterministic_and_accurate():
    first = {k: v.clone() for k, v in digits._trained_state().items()}
    digits._trained_state.cache_clear()
    second = digits._trained_state()
    assert all(torch.equal(first[k], second[k]) for k in first)
    data = digits.eval_data()
    with torch.no_grad():
        model = digits.build()
        predictions = np.concatenate([model(torch.from_numpy(b["input"])).argmax(1).numpy() for b in data.inputs])
    assert len(data.labels) == 450  # held-out quarter of the 1,797 images
    assert np.mean(predictions == data.labels) >= 0.95


@pytest.mark.int8
@pytest.mark.onnxruntime
def test_int8_reports_task_accuracy_delta(qv_pipeline):
    result = qv_pipeline.run(Case("digits-cnn", "int8", "onnxruntime"))
    task = result.metrics["task"]
    assert task["reference_accuracy"] >= 0.95
    assert task["accuracy_drop_points"] == pytest.approx(100 * (task["reference_accuracy"] - task["accuracy"]))
    assert any(c["metric"] == "accuracy drop (points)" for c in result.metrics["checks"])
