"""Real third-party model code: Hugging Face transformers models built from a config with
random weights (nothing is downloaded from a hub). Needs `pip install transformers`."""

from __future__ import annotations

import torch
from torch import nn


class LogitsOnly(nn.Module):
    """The model's logits as a plain tensor (a ModelOutput would be compared key by key
    too; a tensor keeps the example small)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def gpt2_tiny() -> nn.Module:
    """A 2-layer GPT-2 (hidden 128, 4 heads, vocabulary 1,000)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2,
        n_embd=128,
        n_head=4,
        n_positions=256,
        vocab_size=1000,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="sdpa",
    )
    return LogitsOnly(GPT2LMHeadModel(config))


def bert_tiny() -> nn.Module:
    """A 2-layer BERT encoder (hidden 128, 4 heads, vocabulary 1,000): its outputs as the
    ModelOutput transformers returns, so parity compares them field by field."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        num_hidden_layers=2,
        hidden_size=128,
        num_attention_heads=4,
        intermediate_size=512,
        vocab_size=1000,
        max_position_embeddings=256,
    )
    return BertModel(config)
