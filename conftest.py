"""This repository's own manifest (fixtures/models.yaml) as its tests judge it, however pytest is invoked
(``pytest``, ``pytest fixtures/models.yaml``, ``pytest -m fp8``)."""
import pytest

# The [zoo] extra's trained networks in formats that cost them more than their bounds allow, measured (2-core AMD
# EPYC, AVX-512 VNNI). The harness must keep failing them with a verdict (a miss, never a crash): strict, so a
# recipe that starts meeting the bound shows as XPASS and this list is revised.
_E4M3 = ("E4M3 rounds all but one of the 180 quantized activations coarser than INT8 (`python -m quantverdict "
         "formats`): top-1 agreement .942-.950 of 0.97 with a tenth of the layers in FP32")
_E2M1 = "E2M1 with 16-value blocks on depthwise ImageNet CNNs: logits' cosine 0.58-0.72 of 0.9 (block 0 diverges first)"
ZOO_FORMAT_COSTS = {("efficientnet-lite1", "fp8"): _E4M3, ("efficientnet-lite2", "fp8"): _E4M3,
                    ("efficientnet-lite0", "fp4"): _E2M1, ("efficientnet-lite1", "fp4"): _E2M1,
                    ("efficientnet-lite2", "fp4"): _E2M1}
# A case whose verdict sits on its bound within what its samples resolve, so that the runner's CPU kernels decide it:
# expected to fail, not strictly (a pass on another CPU is no news).
ZOO_ON_THE_BOUND = {("efficientnet-lite2", "int8", "onnxruntime"): (
    "Lite2's INT8 top-1 agreement sits on the 0.97 bound within the resolution of its 504 crops (one standard error: "
    ".0076): .980 on an EPYC with AVX-512 VNNI, .966 on ONNX Runtime's integer kernels on an AVX2-only EPYC")}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from quantverdict.run.pytest_plugin import CaseFailed

    for item in items:
        case = getattr(item, "case", None)
        if not case:
            continue
        reason = ZOO_FORMAT_COSTS.get((case.model, case.precision))
        if reason:
            item.add_marker(pytest.mark.xfail(strict=True, raises=CaseFailed, reason=f"the format's cost: {reason}"))
        reason = ZOO_ON_THE_BOUND.get((case.model, case.precision, case.backend))
        if reason:
            item.add_marker(pytest.mark.xfail(strict=False, raises=CaseFailed, reason=f"on the bound: {reason}"))
