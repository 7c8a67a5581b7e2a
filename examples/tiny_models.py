"""Three tiny models, a tiny causal LM with its own generation loop, and one larger
transformer, built in code with random weights (nothing is downloaded)."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in: int = 64, d_hidden: int = 256, d_out: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, d_hidden),
            nn.GELU(),
            nn.Linear(d_hidden, d_hidden),
            nn.GELU(),
            nn.Linear(d_hidden, d_out),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class TransformerBlock(nn.Module):
    """A pre-norm block over token ids: embedding, causal self-attention, MLP, logits."""

    def __init__(self, vocab: int = 512, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.out = nn.Linear(d, vocab)
        self.heads = heads

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        att = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        x = x + self.mlp(self.ln2(x))
        return self.out(x)


class Layer(nn.Module):
    """One pre-norm decoder layer: causal self-attention, then an MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        att = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """A 12-layer decoder of hidden size 512 (8 heads, about 39M parameters): large
    enough that what a warm start still pays for (Dynamo tracing every layer,
    AOTAutograd) shows."""

    def __init__(self, vocab: int = 1024, d: int = 512, heads: int = 8, layers: int = 12) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Layer(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.out(self.ln(x))


class TinyLM(Transformer):
    """A 2-layer decoder LM that keeps its own static KV cache, gpt-fast style: its
    ``prefill`` and ``decode`` below are a generate target's own loop
    (docs/generation.md). Called with token ids alone, a plain causal forward."""

    def __init__(self, vocab: int = 512, d: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__(vocab, d, heads, layers)
        self.heads = heads
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, ids: torch.Tensor, position: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(ids)
        for i, layer in enumerate(self.layers):
            x = x + self._attend(layer, layer.ln1(x), i, position)
            x = x + layer.mlp(layer.ln2(x))
        return self.out(self.ln(x))

    def _attend(self, layer: Layer, x: torch.Tensor, i: int, position: torch.Tensor | None):
        b, s, d = x.shape
        q, k, v = layer.qkv(x).view(b, s, 3, self.heads, d // self.heads).transpose(1, 3).unbind(2)
        if position is None:  # no cache: the whole sequence, causal
            att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # written into the cache at ``position``; each query sees the slots up to its own
            keys, values = self.cache[i]
            keys.index_copy_(2, position, k)
            values.index_copy_(2, position, v)
            seen = torch.arange(keys.shape[2], device=x.device)[None, :] <= position[:, None]
            att = nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=seen)
        return layer.proj(att.transpose(1, 2).reshape(b, s, d))


@torch.compiler.disable
def _static_cache(model: TinyLM, batch: int, length: int) -> None:
    """The model's KV cache for ``batch`` sequences of ``length`` tokens: the same tensors
    again when the shapes are (a compiled decode then reads the tensors it was traced on)."""
    d = model.embed.embedding_dim
    shape = (batch, model.heads, length, d // model.heads)
    if not model.cache or model.cache[0][0].shape != shape:
        w = model.embed.weight
        model.cache = [(w.new_zeros(shape), w.new_zeros(shape)) for _ in model.layers]


def prefill(model: TinyLM, input_ids: torch.Tensor, cache_length: int) -> torch.Tensor:
    """The prompt through the model into its cache: the first new token's logits
    ``[batch, vocab]`` (``generate.prefill``)."""
    _static_cache(model, input_ids.shape[0], cache_length)
    position = torch.arange(input_ids.shape[1], device=input_ids.device)
    return model(input_ids, position)[:, -1]


def decode(model: TinyLM, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """One token ``[batch, 1]`` at ``position``: the next token's logits
    (``generate.decode``)."""
    return model(token, position)[:, -1]


def mlp() -> nn.Module:
    return MLP()


def cnn() -> nn.Module:
    return SmallCNN()


def transformer_block() -> nn.Module:
    return TransformerBlock()


def transformer_12() -> nn.Module:
    return Transformer()


def tiny_lm() -> nn.Module:
    return TinyLM()
