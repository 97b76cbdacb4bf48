"""A real labeled task: a small CNN trained on scikit-learn's bundled 8×8 digits.

The trained weights ship with the package (``data/digits-cnn.npz``, 150 KB) and are what the
model is built from: PyTorch's CPU training rounds differently by instruction set, so training at
build time gave other weights (and other numbers everywhere downstream) on every runner class.
``python -m quantverdict.models.digits`` is the script that made the file (seeded, one thread,
12 epochs of Adam on the training split). The digits are read from the CSV scikit-learn ships,
without importing scikit-learn (a second of imports), and split by class with a seeded permutation.
"""
from __future__ import annotations

import functools
import gzip
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from quantverdict.errors import HarnessError
from quantverdict.models.spec import Batch, InputSpec, LabeledData, ModelSpec

EPOCHS = 12
BATCH = 64


TEST_FRACTION = 0.25


def _digits_csv() -> Path:
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise HarnessError("model 'digits-cnn' needs scikit-learn's bundled digits: pip install scikit-learn")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


@functools.lru_cache(maxsize=1)
def _split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, test images, train labels, test labels): a quarter of each class held out."""
    with gzip.open(_digits_csv(), "rt") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.float64)
    images = (table[:, :-1].reshape(-1, 1, 8, 8) / 16.0).astype(np.float32)  # (n, 1, 8, 8) in [0, 1]
    labels = table[:, -1].astype(np.int64)
    rng = np.random.default_rng(0)
    test = np.zeros(len(labels), bool)
    for digit in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == digit))
        test[members[:round(TEST_FRACTION * len(members))]] = True
    train_order, test_order = rng.permutation(np.flatnonzero(~test)), rng.permutation(np.flatnonzero(test))
    return images[train_order], images[test_order], labels[train_order], labels[test_order]


def _net() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )


WEIGHTS = "data/digits-cnn.npz"


def train() -> dict[str, np.ndarray]:
    """Train the network from seeded weights (the script behind the shipped file; its result depends
    on the CPU's kernels, which is why the file, not this, is what the model is built from)."""
    import torch
    from torch import nn

    from quantverdict.models.seeded import seeded_init

    x_train, _, y_train, _ = _split()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = seeded_init(_net(), seed=0)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        order = np.random.default_rng(0)
        x, y = torch.from_numpy(x_train), torch.from_numpy(y_train).long()
        for _ in range(EPOCHS):
            perm = torch.from_numpy(order.permutation(len(x)))
            for start in range(0, len(x), BATCH):
                idx = perm[start:start + BATCH]
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def build() -> Any:
    """The network with the shipped trained weights."""
    import torch
    from importlib import resources

    with resources.files("quantverdict.models").joinpath(WEIGHTS).open("rb") as handle, \
            np.load(handle, allow_pickle=False) as stored:
        state = {name: torch.from_numpy(stored[name].copy()) for name in stored.files}
    model = _net()
    model.load_state_dict(state)
    return model.eval()


def _batches(images: np.ndarray, size: int = 50) -> list[Batch]:
    return [{"input": images[i:i + size]} for i in range(0, len(images), size)]


def calibration() -> list[Batch]:
    """256 training images: calibration never sees the test split."""
    return _batches(_split()[0][:256], size=64)


def eval_data() -> LabeledData:
    _, x_test, _, y_test = _split()
    return LabeledData(_batches(x_test), y_test)


SPEC = ModelSpec(
    "digits-cnn", [InputSpec("input", (50, 1, 8, 8), value_range=(0.0, 1.0))], ["logits"],
    build=build, task="classification", calibration=calibration, eval_data=eval_data,
    build_files=[Path(__file__).resolve().parent / WEIGHTS],  # the shipped weights are part of its key
)


if __name__ == "__main__":  # python -m quantverdict.models.digits: train and write the shipped weights
    from pathlib import Path

    target = Path(__file__).resolve().parent / WEIGHTS
    target.parent.mkdir(exist_ok=True)
    np.savez_compressed(target, **train())
    print(f"wrote {target}")
