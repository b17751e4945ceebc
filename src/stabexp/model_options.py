"""The options of a model that a user sets (conf/model/*.yaml), defined once: the config schema
(stabexp.config.ModelConfig) adds which preset and architecture they belong to, the model
(model/transformer.py TransformerConfig) what a run derives for it (vocabulary, depths,
placement, DeepNorm's alpha, positions, padding). It imports nothing, so that reading the
config does not import torch."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(kw_only=True)
class ModelOptions:
    d_model: int = 64          # residual width d (normmlp: hidden width)
    ffn_dim: int = 128         # FFN hidden width
    n_heads: int = 2           # attention heads; d_model must divide by it
    norm: str = "layernorm"    # layernorm | rmsnorm, at every norm position of the group's placement
    dropout: float = 0.0       # on the embeddings, the attention weights and the branch outputs;
                               # 0 keeps runs deterministic
    qk_norm: bool = False      # QK-LayerNorm: a norm over each head's q and k before q.k
                               # (Dehghani et al. 2023)


def model_options(model_cfg) -> dict:
    """The ModelOptions fields of a composed `model` config, by name."""
    return {f.name: model_cfg[f.name] for f in fields(ModelOptions)}
