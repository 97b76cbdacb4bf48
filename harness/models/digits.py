"""A real labeled task: a small CNN trained in seconds on scikit-learn's bundled 8×8 digits.

Training is deterministic (fixed seeds, one thread), so every process that builds this model
gets the same weights, and the content-hashed caches stay valid across runs.
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from harness.models.spec import Batch, InputSpec, LabeledData, ModelSpec

EPOCHS = 12
BATCH = 64


@functools.lru_cache(maxsize=1)
def _split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # (n, 1, 8, 8) in [0, 1]
    return tuple(train_test_split(images, digits.target, test_size=0.25, random_state=0,
                                  stratify=digits.target))  # type: ignore[return-value]


def _net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    )


@functools.lru_cache(maxsize=1)
def _trained_state() -> dict[str, torch.Tensor]:
    x_train, _, y_train, _ = _split()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # reductions in one thread are reproducible bit for bit
    try:
        torch.manual_seed(0)
        model = _net()
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
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def build() -> nn.Module:
    model = _net()
    model.load_state_dict(_trained_state())
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
)
