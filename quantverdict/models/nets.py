"""The torch modules behind the synthetic specs (imported only when a module is built)."""
from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    """ResNet basic block: the residual Add is where Q/DQ placement matters."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        y = torch.relu(self.bn1(self.conv1(x)))
        return self.head(torch.relu(x + self.bn2(self.conv2(y))))


class TransformerBlock(nn.Module):
    """One pre-norm encoder block (attention + LayerNorm + GELU MLP) over token embeddings."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10),
    )


def dwblock() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU6(),
        nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.BatchNorm2d(32), nn.ReLU6(),
        nn.Conv2d(32, 64, 1), nn.BatchNorm2d(64), nn.ReLU6(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )


class BertEncoder(nn.Module):
    """A BERT encoder written out op by op (embeddings, post-norm layers of masked attention and GELU
    MLP), mean-pooled over unmasked tokens and L2-normalised: a sentence-embedding network such as
    all-MiniLM-L6-v2, whose Hugging Face names ``load_state_dict`` takes. The attention mask is added
    to the scores as the large negative number Hugging Face uses (the compute type's lowest finite
    value), so a recipe that quantizes that Add, or rounds it to a narrower type, shows it."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, hidden: int, positions: int = 512):
        super().__init__()
        self.embeddings = nn.ModuleDict({"word_embeddings": nn.Embedding(vocab, dim),
                                         "position_embeddings": nn.Embedding(positions, dim),
                                         "token_type_embeddings": nn.Embedding(2, dim),
                                         "LayerNorm": nn.LayerNorm(dim, eps=1e-12)})
        self.encoder = nn.ModuleDict({"layer": nn.ModuleList(_BertLayer(dim, heads, hidden) for _ in range(layers))})

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        e = self.embeddings
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = e["word_embeddings"](input_ids) + e["position_embeddings"](positions)[None] + \
            e["token_type_embeddings"].weight[0]
        x = e["LayerNorm"](x)
        mask = attention_mask.to(x.dtype)
        bias = (1.0 - mask[:, None, None, :]) * torch.finfo(x.dtype).min  # as Hugging Face: finite in every dtype
        for layer in self.encoder["layer"]:
            x = layer(x, bias)
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9)
        return nn.functional.normalize(pooled, dim=-1)


class _BertLayer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.attention = nn.ModuleDict({
            "self": nn.ModuleDict({"query": nn.Linear(dim, dim), "key": nn.Linear(dim, dim), "value": nn.Linear(dim, dim)}),
            "output": nn.ModuleDict({"dense": nn.Linear(dim, dim), "LayerNorm": nn.LayerNorm(dim, eps=1e-12)})})
        self.intermediate = nn.ModuleDict({"dense": nn.Linear(dim, hidden)})
        self.output = nn.ModuleDict({"dense": nn.Linear(hidden, dim), "LayerNorm": nn.LayerNorm(dim, eps=1e-12)})

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        attn, batch, tokens = self.attention, x.shape[0], x.shape[1]

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(batch, tokens, self.heads, -1).transpose(1, 2)

        q, k, v = (heads(attn["self"][name](x)) for name in ("query", "key", "value"))
        scores = q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5) + bias
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, tokens, -1)
        x = attn["output"]["LayerNorm"](x + attn["output"]["dense"](context))
        h = nn.functional.gelu(self.intermediate["dense"](x))
        return self.output["LayerNorm"](x + self.output["dense"](h))
