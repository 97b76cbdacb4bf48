"""GPTQ's rounding of a stack of weights, one input column after another, given each one's H: the arithmetic of
:mod:`quantverdict.precision.gptq`, apart from the graphs it reads and writes.

Each column is rounded and its error spread over the columns not yet rounded through U, the upper Cholesky factor of
H⁻¹ (H = Σ x xᵀ, damped). GPTQ's reference implementation factorizes H, inverts it from its factor and factorizes the
inverse; here U is the inverse of H's factor in the reversed order (:func:`_inverse_factor`): the same U, half the
arithmetic. A transformer's 2048-column layers spent most of their rounding there (six of them: 2.3 → 1.2 s on 2
cores). The errors of a block's columns reach the rest of the block a few columns at a time (:data:`SUB_BLOCK`): one
column at a time, the updates were numpy operations over the whole block per column (with the factor above, a
1280 × 320 weight's rounding 47 → 17 ms).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from quantverdict.precision.matrix_device import held, torch_device
from quantverdict.precision.pools import loaded_torch

if TYPE_CHECKING:
    import torch

DAMPING = 0.01  # of the mean H diagonal, as GPTQ's reference implementation
BLOCK = 128  # columns rounded before the rest of the matrix is updated (lazy batch updates)
SUB_BLOCK = 16  # columns of a block rounded before the rest of the block is updated
LEAF = 64  # the size below which a triangular inverse is one solve against the identity
Quantize = Callable[[np.ndarray], np.ndarray]  # values already divided by their scale → the format's grid


def rounded_columns(weight: np.ndarray, hessian: np.ndarray, quantize: Quantize) -> np.ndarray:
    """Grid values for ``weight`` ([groups, rows, columns], in units of its scales) that keep
    ``weight @ x`` close over inputs of second moment ``hessian`` ([groups, columns, columns]); the factorization and
    the updates beyond a block on the matrix device (:mod:`quantverdict.precision.matrix_device`), a block's columns on
    the CPU."""
    device = torch_device()
    with held(device):
        return _rounded_columns(weight, hessian, quantize, device)


def _rounded_columns(weight: np.ndarray, hessian: np.ndarray, quantize: Quantize,
                     device: "torch.device") -> np.ndarray:
    torch = loaded_torch()

    w = torch.from_numpy(np.array(weight, np.float64)).to(device)
    h = torch.from_numpy(np.array(hessian, np.float64)).to(device)
    columns = w.shape[-1]
    diagonal = torch.diagonal(h, dim1=1, dim2=2)
    dead = diagonal == 0  # an input that is always zero: its weight is rounded to nearest
    order = torch.argsort(diagonal, dim=1, descending=True)
    w = torch.gather(w, 2, order[:, None, :].expand_as(w))
    h = torch.gather(torch.gather(h, 1, order[:, :, None].expand_as(h)), 2, order[:, None, :].expand_as(h))
    index = torch.arange(columns, device=device)
    h[:, index, index] += DAMPING * diagonal.mean(1, keepdim=True) + torch.gather(dead, 1, order).double()
    upper = _inverse_factor(h)
    grid = torch.zeros_like(w)
    for start in range(0, columns, BLOCK):
        end = min(start + BLOCK, columns)
        # a block's columns one after another ([column, group, row]) in numpy: the loop over them is Python's, and
        # numpy's small operations cost a few µs where torch's cost tens
        block = w[:, :, start:end].permute(2, 0, 1).contiguous().cpu().numpy()
        factor = upper[:, start:end, start:end].contiguous().cpu().numpy()  # [group, row, column]
        errors, rounded = np.empty_like(block), np.empty_like(block)
        for first in range(0, end - start, SUB_BLOCK):
            last = min(first + SUB_BLOCK, end - start)
            for i in range(first, last):
                rounded[i] = quantize(block[i])
                errors[i] = (block[i] - rounded[i]) / factor[:, i, i][:, None]
                block[i:last] -= errors[i][None] * factor[:, i, i:last].T[:, :, None]
            if last < end - start:  # [group, row, these columns] @ [group, these columns, the block's others]
                spread = errors[first:last].transpose(1, 2, 0) @ factor[:, first:last, last:]
                block[last:] -= spread.transpose(2, 0, 1)
        grid[:, :, start:end] = torch.from_numpy(rounded).permute(1, 2, 0).to(device)
        w[:, :, end:] -= torch.from_numpy(errors).permute(1, 2, 0).contiguous().to(device) @ upper[:, start:end, end:]
    restore = torch.argsort(order, dim=1)
    return torch.gather(grid, 2, restore[:, None, :].expand_as(grid)).cpu().numpy()


def _inverse_factor(h: "torch.Tensor") -> "torch.Tensor":
    """U, upper triangular with a positive diagonal, such that Uᵀ U = H⁻¹ (each of ``h``'s groups): where H = V Vᵀ
    with V upper triangular (the Cholesky factor of H with its rows and columns reversed, reversed back), U = V⁻¹, the
    one such factor. A singular or indefinite H raises ``torch.linalg.LinAlgError`` as factorizing it does."""
    torch = loaded_torch()

    return _triangular_inverse(torch.linalg.cholesky(h.flip(1, 2)).flip(1, 2))


def _triangular_inverse(upper: "torch.Tensor") -> "torch.Tensor":
    """The inverse of each upper triangular matrix of ``upper`` ([groups, n, n]), from its halves' inverses and two
    products: a solve against the identity does n³ multiplications, this n³/3."""
    torch = loaded_torch()

    size = upper.shape[-1]
    if size <= LEAF:
        identity = torch.eye(size, dtype=upper.dtype, device=upper.device).expand_as(upper)
        return torch.linalg.solve_triangular(upper, identity, upper=True)
    half = size // 2
    first, second = _triangular_inverse(upper[:, :half, :half]), _triangular_inverse(upper[:, half:, half:])
    out = torch.zeros_like(upper)
    out[:, :half, :half], out[:, half:, half:] = first, second
    out[:, :half, half:] = -(first @ upper[:, :half, half:]) @ second
    return out
