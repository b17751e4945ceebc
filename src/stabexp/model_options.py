"""The options of a model: those a user sets (conf/model/*.yaml, `ModelOptions`), defined once,
and the model's own config (`TransformerConfig`), which adds what a run derives for it
(vocabulary, depths, placement, DeepNorm's alpha, positions, padding). The config schema
(stabexp.config.ModelConfig) adds to the first which preset and architecture they belong to.
It imports nothing, so that reading the config does not import torch."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

# The norm kinds model.norm and group.norm name, each built by model/norms.py's make_norm.
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


@dataclass(kw_only=True)
class TransformerConfig(ModelOptions):
    """ModelOptions (d_model, ffn_dim, n_heads, norm, dropout, qk_norm: stabexp/model_options.py,
    the options a user sets) plus what a run derives for the model:"""

    vocab_size: int            # shared source/target vocabulary (embeddings tied with the output)
    encoder_layers: int = 6    # N
    decoder_layers: int = 6    # M
    residual: str = "postln"   # a placement name (PLACEMENTS) or dotted path: that of every stack...
    encoder_residual: Optional[str] = None  # ... unless a stack has its own (Admin's hybrids,
    decoder_residual: Optional[str] = None  # e.g. a Post-LN encoder under a Pre-LN decoder)
    encoder_alpha: float = 1.0  # DeepNorm's residual scale alpha for the encoder stack
    decoder_alpha: float = 1.0  # ... and for the decoder stack
    max_len: int = 512         # positions covered by the sinusoidal table
    pad_id: Optional[int] = None  # padding token of variable-length batches; None: no masks
    mix_ratio: float = 0.25    # Mix-LN: the share a of the layers (the bottom floor(a L)) that are Post-LN
    input_scale: bool = False  # a per-dimension scale on each stack's input: what a Post-LN model
                               # folded from Admin keeps of the first omega (model/fold.py)

    def placement(self, stack: str) -> str:
        """The placement name of `stack` ("encoder" or "decoder")."""
        own = self.encoder_residual if stack == "encoder" else self.decoder_residual
        return own if own is not None else self.residual
