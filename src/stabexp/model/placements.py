"""The residual placements: how a sublayer combines the stream x with its branch G(x). One small
`Residual` subclass per placement of the studies, its forward the paper's formula with its
citation; `Placement` says what else a placement builds (the slots of its branches, the ends of
each stack), and PLACEMENTS names the built-ins (registered as the package's entry point of the
`stabexp.placements` group, beside those of other packages; stabexp.plugins).
docs/methods.md, "Residual placements", gives every formula with its paper and the authors' code.

The measurements read a placement from outside (model/transformer.py's docstring says how): a
placement with a norm on the residual stream names it `ln`, its branch is `branch`, and its
dropout on the branch `drop`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
import torch.nn as nn

from stabexp import plugins
from stabexp.model.norms import HeadScale, Scale, Shift, make_norm
from stabexp.model_options import TransformerConfig


# --- residual placements: how x and its branch G combine ----------------------------------

class Residual(nn.Module):
    """One residual sublayer x <- combine(x, G(x)), G = `branch`. Each subclass below is one
    placement of the studies; its forward is the paper's formula. A placement with a norm on
    the residual stream names it `ln` (the module docstring says why the names matter)."""

    has_norm = True  # False: the placement has no normalisation at all
    # What the class says of the Placement it makes on its own (`Placement.of`: a user's
    # Residual subclass named by a dotted path or an entry point); PLACEMENTS spells the
    # built-ins out in full.
    final_norm = False       # True: each stack ends with a norm (Pre-LN-like: the stream itself is
                             # never normalised)
    encoder_decoder = True   # False: defined for one stack (decoder-only LMs), so an
                             # encoder-decoder is refused

    def __init__(self, branch: nn.Module, c: TransformerConfig, stack: str, shared: Dict[str, nn.Parameter],
                 layer: int = 1):
        super().__init__()
        self.branch = branch
        self.drop = nn.Dropout(c.dropout) if c.dropout > 0 else None

    def _g(self, x: torch.Tensor, *context: torch.Tensor) -> torch.Tensor:
        return self._drop(self.branch(x, *context))

    def _drop(self, g: torch.Tensor) -> torch.Tensor:
        return self.drop(g) if self.drop is not None else g


class PostLN(Residual):
    def __init__(self, branch, c, stack, shared, layer=1):
        super().__init__(branch, c, stack, shared, layer)
        self.ln = make_norm(c.norm, c.d_model)

    def forward(self, x, *context):
        return self.ln(x + self._g(x, *context))                   # Vaswani et al. 2017


class PreLN(Residual):
    final_norm = True

    def __init__(self, branch, c, stack, shared, layer=1):
        super().__init__(branch, c, stack, shared, layer)
        self.ln = make_norm(c.norm, c.d_model)

    def forward(self, x, *context):
        return x + self._g(self.ln(x), *context)                   # Xiong et al. 2020


class DeepNorm(Residual):
    def __init__(self, branch, c, stack, shared, layer=1):
        super().__init__(branch, c, stack, shared, layer)
        self.ln = make_norm(c.norm, c.d_model)
        self.alpha = c.encoder_alpha if stack == "encoder" else c.decoder_alpha

    def forward(self, x, *context):
        return self.ln(self.alpha * x + self._g(x, *context))      # DeepNet Sec. 2.3


class Admin(Residual):
    def __init__(self, branch, c, stack, shared, layer=1):
        super().__init__(branch, c, stack, shared, layer)
        self.ln = make_norm(c.norm, c.d_model)
        # A learnable per-dimension residual scale, set before training by init.py (profiled or
        # closed form).
        self.omega = nn.Parameter(torch.ones(c.d_model))

    def forward(self, x, *context):
        # G(x) first: Admin's profiling (model/init.py) sets omega when it sees G(x).
        g = self._g(x, *context)
        return self.ln(self.omega * x + g)                         # Admin (Liu et al. 2020), Sec. 4


def _layer_rezero_alpha(shared: Dict[str, nn.Parameter]) -> nn.Parameter:
    # One alpha per layer, shared by all its sublayers, as the authors' rztx.py `resweight`
    # (the paper's x_{i+1} = x_i + alpha_i F(x_i) does not say). Its gradient is counted in the
    # layer's last sublayer (the FFN) by the per-sublayer grad_norm.
    if "rezero_alpha" not in shared:
        shared["rezero_alpha"] = nn.Parameter(torch.zeros(1))
    return shared["rezero_alpha"]


class ReZero(Residual):
    has_norm = False

    def __init__(self, branch, c, stack, shared, layer=1):
        super().__init__(branch, c, stack, shared, layer)
        self.alpha = _layer_rezero_alpha(shared)

    def forward(self, x, *context):
        return x + self.alpha * self._g(x, *context)                # ReZero (Bachlechner et al. 2020)


class ReZeroPostLN(Residual):
    def __init__(self, branch, c, stack, shared, layer=1):
        super().__init__(branch, c, stack, shared, layer)
        self.ln = make_norm(c.norm, c.d_model)
        self.alpha = _layer_rezero_alpha(shared)

    def forward(self, x, *context):
        return self.ln(x + self.alpha * self._g(x, *context))      # Clinic's rezero_postln


class Fixup(Residual):
    has_norm = False

    def __init__(self, branch, c, stack, shared, layer=1):
        super().__init__(branch, c, stack, shared, layer)
        self.shift, self.scale = Shift(), Scale()

    def forward(self, x, *context):
        # Fixup (Zhang et al. 2019) as its authors' transformer_zero.py: x + scale(G(shift(x)))
        return x + self.scale(self._g(self.shift(x), *context))


class Plain(Residual):
    has_norm = False

    def forward(self, x, *context):
        return x + self._g(x, *context)                            # T-Fixup (Huang et al. 2020): no LN


class Sandwich(Residual):
    final_norm = True

    def __init__(self, branch, c, stack, shared, layer=1):
        super().__init__(branch, c, stack, shared, layer)
        self.ln = make_norm(c.norm, c.d_model)
        self.ln_out = make_norm(c.norm, c.d_model)

    def forward(self, x, *context):
        # Sandwich-LN (CogView, Ding et al. 2021): Pre-LN plus an LN on the branch output;
        # NormFormer's "Post-Attn LN" has the same shape.
        return x + self._drop(self.ln_out(self.branch(self.ln(x), *context)))


class NormedStream(Residual):
    def __init__(self, branch, c, stack, shared, layer=1):
        super().__init__(branch, c, stack, shared, layer)
        self.ln = make_norm(c.norm, c.d_model)

    def forward(self, x, *context):
        # HybridNorm's FFN (Zhuo et al. 2025, arXiv 2503.04598; BryceZhuo/HybridNorm
        # OLMoSequentialBlock with ffn_residual_after_norm): the stream is normalised first and
        # the branch added to the normalised stream, LN(x) + G(LN(x)).
        y = self.ln(x)
        return y + self._g(y, *context)


class ReorderedNorm(Residual):
    final_norm, encoder_decoder = True, False

    def __init__(self, branch, c, stack, shared, layer=1):
        super().__init__(branch, c, stack, shared, layer)
        self.ln_out = make_norm(c.norm, c.d_model)

    def forward(self, x, *context):
        # OLMo 2 (OLMo et al. 2025, arXiv 2501.00656; OLMo-core
        # ReorderedNormTransformerBlock): the norm on the branch output only, the stream never
        # normalised inside the stack. No `ln`: no norm sits on the residual stream.
        return x + self._drop(self.ln_out(self.branch(x, *context)))


class LayerNormScaled(PreLN):
    encoder_decoder = False

    def __init__(self, branch, c, stack, shared, layer=1):
        super().__init__(branch, c, stack, shared, layer)
        self.depth_scale = 1.0 / math.sqrt(layer)

    def forward(self, x, *context):
        # LayerNorm Scaling (Sun et al. 2025, "The Curse of Depth", arXiv 2502.05795; OLMo-core
        # LayerNormScaledTransformerBlock):
        # Pre-LN with the norm's output times 1/sqrt(l), l the layer's 1-based index, on both
        # sublayers of the layer.
        return x + self._g(self.ln(x) * self.depth_scale, *context)


@dataclass(frozen=True)
class Placement:
    """What one `residual` style builds: the residual piece of every sublayer, the slots of
    its branches, and the ends of each stack."""

    residual: Callable                       # the Residual subclass of every sublayer...
    self_attn: Optional[Callable] = None     # ... unless the self-attention has its own
    attn_inner: Optional[Callable] = None    # self-attention, on the heads before W_O (c -> module)
    attn_post: Optional[Callable] = None     # self-attention, after W_O
    ffn_pre_act: Optional[Callable] = None   # FFN, between fc1 and the ReLU
    ffn_inner: Optional[Callable] = None     # FFN, between the ReLU and fc2
    bias: bool = True                        # biases in every Linear of the branches
    final: Optional[Callable] = None         # on top of each stack: (c, stack) -> module
    dense_history: bool = False              # DLCL's combination of every earlier layer
    qkv_norm: bool = False                   # self-attention: per-head norms of q, k and v (HybridNorm)
    embed_norm: bool = False                 # a norm on each stack's input embedding (Peri-LN)
    by_layer: Optional[Callable] = None      # (c, layer, n_layers) -> the Placement that builds
                                             # that layer, for placements that mix two
                                             # (Mix-LN, HybridNorm*); the stack ends stay this one's
    encoder_decoder: bool = True             # False: the paper defines it for one stack only
                                             # (decoder-only LMs), so an encoder-decoder is refused

    @property
    def has_norm(self) -> bool:
        """False when no layer of the placement has a norm (ReZero, Fixup, T-Fixup)."""
        return self.residual.has_norm

    @classmethod
    def of(cls, residual: type) -> "Placement":
        """The Placement a Residual subclass makes on its own: every sublayer that residual, no
        slots filled, the stack ends and the encoder-decoder as its class attributes say."""
        return cls(residual, final=_final_norm if residual.final_norm else None,
                   encoder_decoder=residual.encoder_decoder)


def _final_norm(c, stack):
    # The stream of a Pre-LN-like stack is never normalised, so each stack ends with a norm.
    return make_norm(c.norm, c.d_model)


def _fixup_stack_end(c, stack):
    # transformer_zero.py: the encoder ends with scale0(shift0(x)), the decoder with shift0(x).
    return nn.Sequential(Shift(), Scale()) if stack == "encoder" else Shift()


def _ffn_norm(c):
    return make_norm(c.norm, c.ffn_dim)


def _heads_norm(c):
    return make_norm(c.norm, c.d_model)


def _head_scale(c):
    return HeadScale(c.n_heads)


def _mix_ln(c, layer, n_layers):
    # + 1e-9: 0.29 * 100 is 28.999... in floating point, and floor(a L) means 29 there.
    return Placement(PostLN) if layer <= math.floor(c.mix_ratio * n_layers + 1e-9) else Placement(PreLN)


def _hybridnorm_star(c, layer, n_layers):
    # HybridNorm*: block 0 Pre-Norm in both sublayers, keeping its QKV-norm (BryceZhuo/HybridNorm,
    # norm_pos_special_config {0: attn_norm True, ffn_residual False}).
    return Placement(PreLN, qkv_norm=True) if layer == 1 else PLACEMENTS["hybridnorm"]


PLACEMENTS: Dict[str, Placement] = {
    "postln": Placement(PostLN),
    "preln": Placement(PreLN, final=_final_norm),
    "deepnorm": Placement(DeepNorm),
    "admin": Placement(Admin),
    "rezero": Placement(ReZero),
    "rezero_postln": Placement(ReZeroPostLN),
    # Fixup rule 3: scalar shifts before every linear layer and the activation, no biases.
    "fixup": Placement(Fixup, ffn_pre_act=lambda c: Shift(), ffn_inner=lambda c: Shift(), bias=False,
                       final=_fixup_stack_end),
    "plain": Placement(Plain),
    "sandwich": Placement(Sandwich, final=_final_norm),
    # NormFormer (Shleifer et al. 2021): Post-Attn LN, HeadScale on the heads before W_O (the
    # paper), an LN after the FFN's activation. Our choice: in both stacks (fairseq has them in
    # its decoder layer only: the paper's models are LMs); cross-attention stays Pre-LN, as in
    # fairseq. No ResScale (optional in the paper).
    "normformer": Placement(PreLN, self_attn=Sandwich, attn_inner=_head_scale, ffn_inner=_ffn_norm,
                            final=_final_norm),
    # ... with fairseq's HeadScale after W_O (facebookresearch/fairseq transformer_layer.py, where
    # the code differs from the paper; docs/methods.md, "Residual placements").
    "normformer_fairseq": Placement(PreLN, self_attn=Sandwich, attn_post=_head_scale, ffn_inner=_ffn_norm,
                                    final=_final_norm),
    # Sub-LN (Magneto, Wang et al. 2022): Pre-LN plus an LN before W_O of the self-attention
    # and after the FFN's activation; cross-attention gets none, as in torchscale (the paper
    # does not say).
    "subln": Placement(PreLN, attn_inner=_heads_norm, ffn_inner=_ffn_norm, final=_final_norm),
    # DLCL (Wang et al. 2019), Pre-LN form: every layer's input is a learned combination of
    # the normalised outputs of all layers below it (DenseHistory).
    "dlcl": Placement(PreLN, final=_final_norm, dense_history=True),
    # --- placements of 2024-2025, defined by their papers for decoder-only LMs ---
    # Peri-LN (Kim et al. 2025, arXiv 2502.02732; OLMo-core PeriNormTransformerBlock):
    # x + Norm(G(Norm(x))), the Sandwich-LN formula, plus a norm on the embedding output and the
    # final norm.
    "peri_ln": Placement(Sandwich, final=_final_norm, embed_norm=True, encoder_decoder=False),
    "reordered_norm": Placement(ReorderedNorm, final=_final_norm, encoder_decoder=False),
    "layernorm_scaled": Placement(LayerNormScaled, final=_final_norm, encoder_decoder=False),
    # Mix-LN (Li et al. 2024, arXiv 2412.13795): Post-LN in the first floor(a L) layers,
    # Pre-LN above them, a = group.mix_ratio (pixeli99/MixLN, norm_type 'post_pre').
    "mix_ln": Placement(PreLN, final=_final_norm, by_layer=_mix_ln, encoder_decoder=False),
    # HybridNorm (Zhuo et al. 2025, arXiv 2503.04598): attention with per-head q, k, v
    # norms and no pre-norm, x + Attn_QKVnorm(x); the FFN on the normalised stream,
    # LN(x) + FFN(LN(x)); a final norm. HybridNorm*: the same with block 0 Pre-Norm.
    "hybridnorm": Placement(NormedStream, self_attn=Plain, qkv_norm=True, final=_final_norm,
                            encoder_decoder=False),
    "hybridnorm_star": Placement(NormedStream, self_attn=Plain, qkv_norm=True, final=_final_norm,
                                 by_layer=_hybridnorm_star, encoder_decoder=False),
}


def _is_residual(obj) -> bool:
    return isinstance(obj, type) and issubclass(obj, Residual)


def as_placement(obj) -> Placement:
    """What a name or dotted path may lead to (stabexp.plugins): a Placement, or a Residual
    subclass, which makes the Placement of its class attributes (`Placement.of`). Either way
    every sublayer is a Residual, so it has the `branch` and `drop` the measurements read."""
    if _is_residual(obj):
        return Placement.of(obj)
    if not isinstance(obj, Placement):
        raise plugins.Rejected(f"it is {plugins.what_is(obj)}, not a Residual subclass or Placement")
    for field, piece in (("residual", obj.residual), ("self_attn", obj.self_attn)):
        if piece is not None and not _is_residual(piece):
            raise plugins.Rejected(f"it is a Placement whose {field} is {plugins.what_is(piece)}, "
                                   "not a Residual subclass")
    return obj


def layer_placement(c: TransformerConfig, stack: str, layer: int) -> Placement:
    """The Placement that builds layer `layer` (1-based) of `stack`: the stack's own, or the one
    its `by_layer` picks for that layer."""
    p = plugins.placement(c.placement(stack))
    if p.by_layer is None:
        return p
    n = c.encoder_layers if stack == "encoder" else c.decoder_layers
    return p.by_layer(c, layer, n)
