"""Task metrics besides arg-max agreement: what the users of a model judge it by.

A model spec may name its own (``metric: module:callable`` in a manifest): a function of the
FP32 reference outputs, the candidate outputs (named arrays, batches joined) and the labels (or
None) returning named scores; the tolerance table bounds them by name (``task_min``/``task_max``).
Embedding models (``task: embedding``) get :func:`embedding_agreement` by default.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

def embedding_agreement(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray],
                        labels: np.ndarray | None = None) -> dict[str, float]:
    """For the first output, one embedding per sample: each sample's cosine with its FP32 embedding
    (worst and mean), the fraction of samples whose nearest other sample (by cosine) is the same as
    under FP32, and the rank correlation of all pairwise similarities (what a search index sees)."""
    name = next(iter(reference))
    ref, cand = (_unit_rows(np.asarray(d[name], np.float64)) for d in (reference, candidate))
    rows = np.sum(ref * cand, axis=1)
    out = {"row_cosine_min": float(rows.min()), "row_cosine_mean": float(rows.mean())}
    if len(ref) > 2:
        ref_sim, cand_sim = ref @ ref.T, cand @ cand.T
        np.fill_diagonal(ref_sim, -np.inf)
        np.fill_diagonal(cand_sim, -np.inf)
        out["neighbour_agreement"] = float(np.mean(ref_sim.argmax(1) == cand_sim.argmax(1)))
        upper = np.triu_indices(len(ref), 1)
        out["similarity_spearman"] = float(np.corrcoef(_ranks(ref_sim[upper]), _ranks(cand_sim[upper]))[0, 1])
    return out


def _unit_rows(values: np.ndarray) -> np.ndarray:
    flat = values.reshape(len(values), -1)
    return flat / np.maximum(np.linalg.norm(flat, axis=1, keepdims=True), 1e-30)


def _ranks(values: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(values))
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    return ranks
