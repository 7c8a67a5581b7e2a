"""The model zoo's factories: stock Hugging Face transformers models, built from tiny
configs with random weights and returned exactly as transformers returns them (no
wrapper: a causal LM's output carries its KV cache, an encoder-decoder's its
``EncoderDecoderCache``, a state-space model's its SSM states). Nothing is downloaded.

``examples/zoo.toml`` names these; ``python benchmarks/zoo.py`` runs each through compile,
warm, check, baseline and an unchanged pull request. Needs ``pip install transformers``.
"""

from __future__ import annotations

import torch

VOCAB = 256  # every text model's vocabulary (zoo.toml's `high` for token ids)


def _tiny_text(**extra):
    """The size every tiny language model shares: 2 layers, hidden 64, 4 heads."""
    return {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 128,
        **extra,
    }


# -- causal language models -----------------------------------------------------------
def llama():
    """A dense causal LM (grouped-query attention), returning logits and its DynamicCache."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    return AutoModelForCausalLM.from_config(LlamaConfig(**_tiny_text(num_key_value_heads=2)))


def qwen2():
    """Qwen2: grouped-query attention with biased q/k/v projections."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    return AutoModelForCausalLM.from_config(Qwen2Config(**_tiny_text(num_key_value_heads=2)))


def mistral():
    """Mistral: grouped-query attention, a sliding window."""
    from transformers import AutoModelForCausalLM, MistralConfig

    return AutoModelForCausalLM.from_config(
        MistralConfig(**_tiny_text(num_key_value_heads=2, sliding_window=64))
    )


def gpt2():
    """GPT-2: learned positions, Conv1D projections, a tied LM head."""
    from transformers import AutoModelForCausalLM, GPT2Config

    return AutoModelForCausalLM.from_config(
        GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128)
    )


def mixtral():
    """A mixture-of-experts causal LM: 4 experts, 2 per token."""
    from transformers import AutoModelForCausalLM, MixtralConfig

    return AutoModelForCausalLM.from_config(
        MixtralConfig(
            **_tiny_text(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
        )
    )


def mamba():
    """A state-space causal LM: its cache holds each layer's convolution and SSM states."""
    from transformers import AutoModelForCausalLM, MambaConfig

    return AutoModelForCausalLM.from_config(
        MambaConfig(vocab_size=VOCAB, hidden_size=64, state_size=8, num_hidden_layers=2)
    )


# -- a causal LM's own generation loop, gpt-fast style (docs/generation.md) -------------
@torch.compiler.disable
def _new_cache(model, length):
    from transformers import StaticCache

    model.loop_cache = StaticCache(config=model.config, max_cache_len=length)
    return model.loop_cache


def prefill(model, input_ids, cache_length):
    """The prompt through the model on a new StaticCache it keeps: the first token's
    logits [batch, vocab] (``generate.prefill``)."""
    cache = _new_cache(model, cache_length)
    position = torch.arange(input_ids.shape[1], device=input_ids.device)
    out = model(input_ids, past_key_values=cache, cache_position=position, use_cache=True)
    return out.logits[:, -1]


def decode(model, token, position):
    """One token [batch, 1] at ``position``: the next token's logits (``generate.decode``)."""
    out = model(token, past_key_values=model.loop_cache, cache_position=position, use_cache=True)
    return out.logits[:, -1]


# -- encoders, encoder-decoders --------------------------------------------------------
def t5():
    """An encoder-decoder (T5), called with keyword encoder and decoder inputs."""
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(
        T5Config(
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            decoder_start_token_id=0,
        )
    )


def bert():
    """A text encoder (BERT): last hidden state and pooled output."""
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(**_tiny_text()))


def wav2vec2():
    """A speech encoder (wav2vec 2.0): a convolutional feature extractor over the raw
    waveform, then a transformer."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    return Wav2Vec2Model(
        Wav2Vec2Config(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            conv_dim=(32, 32, 32),
            conv_stride=(5, 2, 2),
            conv_kernel=(10, 3, 3),
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
            do_stable_layer_norm=True,
            feat_extract_norm="layer",
        )
    )


# -- vision ------------------------------------------------------------------------------
def resnet():
    """A CNN (ResNet from transformers) with a classification head."""
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(
        ResNetConfig(
            embedding_size=16,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            layer_type="basic",
            num_labels=10,
        )
    )


def vit():
    """A vision transformer with a classification head."""
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(
        ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            num_labels=10,
        )
    )


def swin():
    """A windowed-attention vision transformer (Swin)."""
    from transformers import SwinConfig, SwinModel

    return SwinModel(
        SwinConfig(
            image_size=32,
            patch_size=4,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 4],
            window_size=4,
        )
    )


def clip():
    """A text-image model with several outputs: both embeddings, both towers' outputs
    and the similarity logits each way."""
    from transformers import CLIPConfig, CLIPModel

    return CLIPModel(
        CLIPConfig(
            text_config={
                "vocab_size": VOCAB,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "max_position_embeddings": 32,
            },
            vision_config={
                "image_size": 32,
                "patch_size": 8,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
            },
            projection_dim=32,
        )
    )


# -- a plain function ---------------------------------------------------------------------
def rope_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Rotary position embeddings then causal attention: a function, not a module
    (``function = "zoo_models:rope_attention"``)."""
    seq, dim = q.shape[-2], q.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-b, a), dim=-1) * sin

    return torch.nn.functional.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=True)
