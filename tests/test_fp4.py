"""NVFP4 simulation: E2M1 and E4M3 rounding checked against independent implementations."""
import ml_dtypes
import numpy as np
import pytest
import torch

from quantverdict.precision.fp4 import BLOCK, E2M1_GRID, fake_quantize_nvfp4, round_e2m1, round_e4m3

pytestmark = pytest.mark.fp4


def test_e2m1_rounding_matches_ml_dtypes_including_every_tie():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(0, 3, 200_000), np.arange(-7, 7.01, 0.125)]).astype(np.float32)
    expected = values.astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    np.testing.assert_array_equal(round_e2m1(values), expected)


def test_e4m3_rounding_matches_torch_float8():
    values = np.random.default_rng(1).uniform(-448, 448, 100_000).astype(np.float32)
    expected = torch.from_numpy(values).to(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(round_e4m3(values), expected)


def test_blocks_of_16_share_one_scale_along_the_reduction_axis():
    weight = np.random.default_rng(2).normal(size=(8, 64)).astype(np.float32)  # Gemm weight [out, in]
    quantized = fake_quantize_nvfp4(weight, axis=1)
    for row in quantized:
        for block in row.reshape(-1, BLOCK):
            scale = np.abs(block).max() / 6.0
            codes = np.abs(block) / scale
            assert np.all(np.isin(np.round(codes, 4), np.round(E2M1_GRID, 4)))
    relative = np.linalg.norm(quantized - weight) / np.linalg.norm(weight)
    assert 0.02 < relative < 0.2  # lossy, as 4 bits are, but not garbage
