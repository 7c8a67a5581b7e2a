"""More stock transformers architectures, beyond the public zoo (``examples/zoo.toml``):
each built with ``AutoModel*.from_config`` from a tiny config of its own model type, with
random weights, and returned as transformers returns it. ``examples/zoo_more.toml``
configures them; ``python benchmarks/zoo.py --more`` compiles and checks each.

Every name in :data:`MODELS` is a factory of this module (``zoo_more:gpt2``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

VOCAB = 256

# the size every tiny text model shares, under the names most configs use
TEXT = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
}
DECODER = {**TEXT, "num_key_value_heads": 2}
SEQ2SEQ = {
    "vocab_size": VOCAB,
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "max_position_embeddings": 128,
    "decoder_start_token_id": 2,
    "pad_token_id": 1,
}
VIT = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
}

# name -> (auto class, model type, config arguments)
MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # causal language models: dense, sliding-window, hybrid, mixture of experts, SSM
    "gpt2": (
        "AutoModelForCausalLM",
        "gpt2",
        {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": VOCAB},
    ),
    "gpt_neox": ("AutoModelForCausalLM", "gpt_neox", TEXT),
    "opt": ("AutoModelForCausalLM", "opt", {**TEXT, "ffn_dim": 128, "word_embed_proj_dim": 64}),
    "bloom": (
        "AutoModelForCausalLM",
        "bloom",
        {"vocab_size": VOCAB, "hidden_size": 64, "n_layer": 2, "n_head": 4},
    ),
    "falcon": (
        "AutoModelForCausalLM",
        "falcon",
        {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
    ),
    "phi": ("AutoModelForCausalLM", "phi", TEXT),
    "phi3": ("AutoModelForCausalLM", "phi3", {**DECODER, "pad_token_id": 0}),
    "gemma": ("AutoModelForCausalLM", "gemma", {**DECODER, "head_dim": 16}),
    "gemma2": ("AutoModelForCausalLM", "gemma2", {**DECODER, "head_dim": 16, "sliding_window": 8}),
    "mistral": ("AutoModelForCausalLM", "mistral", {**DECODER, "sliding_window": 8}),
    "qwen2": ("AutoModelForCausalLM", "qwen2", DECODER),
    "qwen3": ("AutoModelForCausalLM", "qwen3", {**DECODER, "head_dim": 16}),
    "qwen3_moe": (
        "AutoModelForCausalLM",
        "qwen3_moe",
        {
            **DECODER,
            "head_dim": 16,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
        },
    ),
    "qwen2_moe": (
        "AutoModelForCausalLM",
        "qwen2_moe",
        {
            **DECODER,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
        },
    ),
    "olmoe": (
        "AutoModelForCausalLM",
        "olmoe",
        {**DECODER, "num_experts": 4, "num_experts_per_tok": 2},
    ),
    "granite": ("AutoModelForCausalLM", "granite", DECODER),
    "stablelm": ("AutoModelForCausalLM", "stablelm", DECODER),
    "jamba": (
        "AutoModelForCausalLM",
        "jamba",
        {
            **DECODER,
            "num_experts": 2,
            "num_experts_per_tok": 1,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "attn_layer_period": 2,
            "attn_layer_offset": 1,
            "mamba_d_state": 8,
            "mamba_expand": 2,
            "use_mamba_kernels": False,
        },
    ),
    "falcon_mamba": (
        "AutoModelForCausalLM",
        "falcon_mamba",
        {"vocab_size": VOCAB, "hidden_size": 64, "state_size": 8, "num_hidden_layers": 2},
    ),
    "mamba2": (
        "AutoModelForCausalLM",
        "mamba2",
        {
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "state_size": 8,
            "num_hidden_layers": 2,
            "num_heads": 8,
            "head_dim": 16,
            "n_groups": 1,
            "chunk_size": 16,
        },
    ),
    # encoder-decoders (keyword decoder inputs)
    "bart": ("AutoModelForSeq2SeqLM", "bart", SEQ2SEQ),
    "pegasus": ("AutoModelForSeq2SeqLM", "pegasus", SEQ2SEQ),
    "marian": ("AutoModelForSeq2SeqLM", "marian", SEQ2SEQ),
    "whisper": (
        "AutoModelForSpeechSeq2Seq",
        "whisper",
        {
            **SEQ2SEQ,
            "num_mel_bins": 16,
            "max_source_positions": 16,
            "max_target_positions": 32,
            "decoder_start_token_id": 2,
        },
    ),
    # text encoders
    "distilbert": (
        "AutoModel",
        "distilbert",
        {"vocab_size": VOCAB, "dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128},
    ),
    "roberta": ("AutoModel", "roberta", {**TEXT, "max_position_embeddings": 130}),
    "albert": ("AutoModel", "albert", {**TEXT, "embedding_size": 32}),
    "electra": ("AutoModel", "electra", {**TEXT, "embedding_size": 32}),
    "deberta_v2": ("AutoModel", "deberta-v2", TEXT),
    # vision
    "convnext": (
        "AutoModelForImageClassification",
        "convnext",
        {"num_stages": 2, "hidden_sizes": [16, 32], "depths": [1, 1], "num_labels": 10},
    ),
    "deit": (
        "AutoModelForImageClassification",
        "deit",
        {**VIT, "num_labels": 10, "architectures": ["DeiTForImageClassification"]},
    ),
    "beit": ("AutoModel", "beit", VIT),
    "segformer": (
        "AutoModelForSemanticSegmentation",
        "segformer",
        {
            "num_encoder_blocks": 2,
            "depths": [1, 1],
            "sr_ratios": [2, 1],
            "hidden_sizes": [16, 32],
            "num_attention_heads": [1, 2],
            "decoder_hidden_size": 32,
            "num_labels": 4,
        },
    ),
    "dinov2": ("AutoModel", "dinov2", VIT),
    "siglip": (
        "AutoModel",
        "siglip",
        {"text_config": {**TEXT, "max_position_embeddings": 32}, "vision_config": VIT},
    ),
}


def build(name: str) -> Any:
    """The model ``name`` of :data:`MODELS`, with random weights."""
    import transformers

    auto, model_type, kwargs = MODELS[name]
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    return getattr(transformers, auto).from_config(config)


def _factory(name: str) -> Callable[[], Any]:
    def make() -> Any:
        return build(name)

    make.__name__ = make.__qualname__ = name
    make.__doc__ = f"{MODELS[name][1]} from a tiny config ({MODELS[name][0]})"
    return make


for _name in MODELS:
    globals()[_name] = _factory(_name)
