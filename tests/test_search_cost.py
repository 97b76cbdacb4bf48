"""What a recipe search costs a team, against ONNX Runtime's ``quantize_static`` on the same graph and calibration
batches (pytest -m benchmark): a first INT8 ``lock`` of an ImageNet-class CNN, and the nightly ``lock --check`` after a
weight change and with nothing changed. Each side runs in a process of its own; wall time goes to pytest-benchmark,
CPU-seconds (the process and the workers it waited for) and peak memory to ``extra_info``, never into asserts."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.benchmark, pytest.mark.int8, pytest.mark.slow]

NETS = textwrap.dedent("""\
    import torch
    import torchvision


    def mobilenet_v2(scale=1.0):
        '''MobileNetV2 (3.5M parameters), seeded, its BatchNormalization statistics measured on the inputs as training
        leaves them: untrained, torchvision's initialisation gives logits of ~1e-10.'''
        torch.manual_seed(0)
        net = torchvision.models.mobilenet_v2(weights=None)
        for layer in net.modules():
            if isinstance(layer, torch.nn.BatchNorm2d):
                layer.momentum = None  # a plain average over the passes
        net.train()
        with torch.no_grad():
            for _ in range(4):
                net(torch.rand(8, 3, 224, 224))
            for parameter in list(net.parameters())[:10]:
                parameter.mul_(scale)  # a training step's change of weights
        return net.eval()


    def changed():
        return mobilenet_v2(1.01)
    """)
# Runs a command's module and says, at its end, its CPU-seconds (with the workers' it waited for) and its peak memory.
MEASURED = textwrap.dedent("""\
    import atexit, json, runpy, sys
    from quantverdict.resources import cpu_seconds, peak_memory_mb
    out, module, sys.argv = sys.argv[1], sys.argv[2], [sys.argv[2], *sys.argv[3:]]
    atexit.register(lambda: open(out, "w").write(json.dumps({"cpu_s": cpu_seconds(), "peak_mb": peak_memory_mb()})))
    runpy.run_module(module, run_name="__main__")
    """)
QUANTIZE_STATIC = textwrap.dedent("""\
    import sys
    import numpy as np
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    batches = list(np.load(sys.argv[3]).values())
    class Reader(CalibrationDataReader):
        items = iter({"image": batch} for batch in batches)
        def get_next(self):
            return next(self.items, None)
    quantize_static(sys.argv[1], sys.argv[2], Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
    """)
MANIFEST = textwrap.dedent("""\
    models:
      - name: mobilenet-v2
        {source}
        inputs: [{{name: image, shape: [8, 3, 224, 224], range: [0, 1]}}]
        outputs: [logits]
        task: classification
        calibration: synthetic
    """)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> Path:
    """A repository declaring the CNN by its exported ONNX file (``quantize_static`` quantizes that file), beside the
    changed weights' graph and the calibration batches the harness makes for it, as ``quantize_static`` reads them."""
    import numpy as np

    from quantverdict.run.pipeline import Pipeline

    root = tmp_path_factory.mktemp("search-cost")
    (root / "cnnnets.py").write_text(NETS)
    sys.path.insert(0, str(root))
    try:
        for factory in ("mobilenet_v2", "changed"):
            (root / "build.yaml").write_text(MANIFEST.format(source=f"build: cnnnets:{factory}\n    build_files: []"))
            exported = Pipeline(root / "export-cache", manifest=root / "build.yaml").store.fp32_onnx("mobilenet-v2")
            (root / f"{factory}.onnx").write_bytes(exported.read_bytes())
    finally:
        sys.path.remove(str(root))
    (root / "models.yaml").write_text(MANIFEST.format(source="onnx: mobilenet_v2.onnx"))
    batches = Pipeline(root / "cache", manifest=root / "models.yaml").store.calibration_batches("mobilenet-v2")
    np.savez(root / "calibration.npz", *[batch["image"] for batch in batches])
    (root / "measured.py").write_text(MEASURED)
    (root / "quantize_static.py").write_text(QUANTIZE_STATIC)
    return root


def _measured(root: Path, module: str, *args: str) -> dict[str, float]:
    """``python -m module args`` in ``root``: its CPU-seconds and peak memory (MB)."""
    out = root / "measured.json"
    done = subprocess.run([sys.executable, str(root / "measured.py"), str(out), module, *args], cwd=root,
                          capture_output=True, text=True)
    assert done.returncode in (0, 3), done.stderr[-2000:]  # 3: the check proposes a lock
    return json.loads(out.read_text())


def _lock(*extra: str) -> tuple[str, ...]:
    return ("quantverdict", "lock", "--manifest", "models.yaml", "--precisions", "int8", "--cache-dir", "cache", *extra)


def _timed(benchmark, run) -> dict[str, float]:
    found: dict[str, float] = {}
    benchmark.pedantic(lambda: found.update(run()), rounds=1, iterations=1)
    benchmark.extra_info.update(found, model="mobilenet_v2 (3.5M parameters)", batches="4 × 8 at 224²")
    return found


def test_a_first_int8_lock(benchmark, cnn):
    benchmark.group = "search cost: first INT8 recipe, MobileNetV2"
    found = _timed(benchmark, lambda: _measured(cnn, *_lock()))
    assert (cnn / "quantverdict.lock").is_file() and found["cpu_s"] > 0


def test_onnxruntime_quantize_static(benchmark, cnn):
    benchmark.group = "search cost: first INT8 recipe, MobileNetV2"
    files = [str(cnn / name) for name in ("mobilenet_v2.onnx", "static.onnx", "calibration.npz")]
    found = _timed(benchmark, lambda: _measured(cnn, "quantize_static", *files))
    assert (cnn / "static.onnx").stat().st_size > 0 and found["cpu_s"] > 0


@pytest.mark.parametrize("change", ["weights", "nothing"])
def test_the_nightly_check(benchmark, cnn, change):
    if not (cnn / "quantverdict.lock").is_file():
        _measured(cnn, *_lock())
    manifest = (cnn / "models.yaml").read_text()
    if change == "weights":
        (cnn / "models.yaml").write_text(manifest.replace("mobilenet_v2.onnx", "changed.onnx"))
    benchmark.group = "search cost: the nightly lock --check, MobileNetV2"
    try:
        found = _timed(benchmark, lambda: _measured(cnn, *_lock("--check")))
    finally:
        (cnn / "models.yaml").write_text(manifest)
    assert found["cpu_s"] > 0
