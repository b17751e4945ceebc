"""The options of a model that a user sets (conf/model/*.yaml), defined once: the config schema
(stabexp.config.ModelConfig) adds which preset and architecture they belong to, the model
(model/transformer.py TransformerConfig) what a run derives for it (vocabulary, depths,
placement, DeepNorm's alpha, positions, padding). It imports nothing, so that reading the
config does not import torch."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

# The norm kinds model.norm and group.norm name, each built by model/transformer.py's make_norm.
NORMS = ("layernorm", "rmsnorm", "dyt")


@dataclass(kw_only=True)
class ModelOptions:
    d_model: int = 64          # residual width d (normmlp: hidden width)
    ffn_dim: int = 128         # FFN hidden width
    n_heads: int = 2           # attention heads; d_model must divide by it
    norm: str = "layernorm"    # one of NORMS, at every norm position of the group's placement
    dropout: float = 0.0       # on the embeddings, the attention weights and the branch outputs;
                               # 0 keeps runs deterministic
    qk_norm: bool = False      # QK-LayerNorm: a norm over each head's q and k before q.k
                               # (Dehghani et al. 2023)
    # norm=dyt (Zhu et al. 2025): alpha_0 of every DyT, 0.5 the paper's default ...
    dyt_alpha: float = 0.5
    # ... unless set per site, as its LLM recipe does (attention / FFN / final 0.8 / 0.2 / 0.2
    # at 7B): the norms of the attention sublayers, of the FFN sublayers, on top of the stack
    dyt_alpha_attn: Optional[float] = None
    dyt_alpha_ffn: Optional[float] = None
    dyt_alpha_final: Optional[float] = None
    learnable_embed_scale: bool = False  # the embeddings' sqrt(d) factor a learnable scalar, init
                                         # sqrt(d) (DyT's LLM recipe, jiachenzhu/DyT `shared_scale`)


def model_options(model_cfg) -> dict:
    """The ModelOptions fields of a composed `model` config, by name."""
    return {f.name: model_cfg[f.name] for f in fields(ModelOptions)}
