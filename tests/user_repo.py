"""A user's repository as strings (a model package and the manifest declaring it): what the plugin's and the
installed product's tests build in a temporary folder, with nothing of this repository in it."""
import textwrap
from pathlib import Path

MODEL = textwrap.dedent("""\
    import numpy as np
    import torch
    from torch import nn


    def make_net():
        torch.manual_seed(3)
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(8, 4)).eval()


    def calibration():
        rng = np.random.default_rng(1)
        return [{"image": rng.uniform(0, 1, (4, 3, 16, 16)).astype(np.float32)} for _ in range(2)]


    def broken_calibration():
        settings = {"mean": 0.5}
        return [{"image": np.full((4, 3, 16, 16), settings["scale"], np.float32)}]
    """)
MANIFEST = textwrap.dedent("""\
    models:
      - name: tiny
        build: tinymodels.nets:make_net
        build_files: []
        inputs: [{name: image, shape: [4, 3, 16, 16], range: [0, 1]}]
        outputs: [scores]
        task: classification
        calibration: tinymodels.nets:calibration
    """)


def written(folder: Path, monkeypatch, files: dict[str, str]) -> Path:
    """``folder`` holding ``files`` (name → text), importable and the working directory, as a user's repository is."""
    for name, text in files.items():
        (folder / name).write_text(text)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(folder)
    return folder


def speaker_manifest(module: str, recipe: str = "") -> str:
    """A manifest of one sequence model ``speaker`` built by ``module``'s ``net`` (frames [4, 10, 16] → an
    embedding), with ``recipe`` (a manifest value) where given. Each test's module its own name: a process imports
    a module once."""
    return textwrap.dedent(f"""\
        models:
          - name: speaker
            build: {module}:net
            build_files: []
            inputs: [{{name: frames, shape: [4, 10, 16]}}]
            outputs: [embedding]
            calibration: synthetic
        """) + (f"    recipe: {recipe}\n" if recipe else "")
