"""The encoder-decoder Transformer (transformer.py), the decoder-only and encoder-only models
(lm.py), their named init rules (init.py); the normalised network of the SMD study (normmlp.py)."""

from __future__ import annotations

from typing import Callable, Dict, Optional

from stabexp.model.init import INIT_RULES, deepnorm_constants, initial_scalars
from stabexp.model.lm import SINGLE_STACK, LanguageModel
from stabexp.model.normmlp import NormMLP, NormMLPConfig
from stabexp.model.transformer import PLACEMENTS, PostLN, Seq2SeqTransformer, TransformerConfig
from stabexp.config import model_norm
from stabexp.model_options import model_options


def build_model(cfg, vocab_size: int, pad_id: Optional[int] = None, max_positions: int = 512):
    """The model a run's config describes, before its init rule runs; the task gives the
    vocabulary, its padding token and the longest sequence."""
    if cfg.model.arch == "normmlp":
        return NormMLP(NormMLPConfig(in_dim=cfg.task.in_dim, width=cfg.model.d_model, depth=cfg.depth,
                                     classes=cfg.task.classes))
    arch = cfg.model.arch
    # `depth` counts the layers of a single stack; an encoder-decoder has N = depth, M = decoder_depth.
    n_enc = 0 if arch == "decoder_only" else cfg.depth
    n_dec = 0 if arch == "encoder_only" else (cfg.decoder_depth if cfg.decoder_depth is not None else cfg.depth)
    g = cfg.group
    placement = {"encoder": g.encoder_residual or g.residual, "decoder": g.decoder_residual or g.residual}
    alphas = {"encoder": 1.0, "decoder": 1.0}
    for stack, k in deepnorm_constants(n_enc, n_dec).items():
        if placement[stack] == "deepnorm":  # the paper's alphas, which torchscale shares
            alphas[stack] = k["alpha"]
    options = {**model_options(cfg.model), "norm": model_norm(cfg)}
    c = TransformerConfig(
        **options, vocab_size=vocab_size, encoder_layers=n_enc, decoder_layers=n_dec,
        residual=g.residual, encoder_residual=g.encoder_residual, decoder_residual=g.decoder_residual,
        encoder_alpha=alphas["encoder"], decoder_alpha=alphas["decoder"], mix_ratio=g.mix_ratio,
        max_len=max_positions, pad_id=pad_id,
    )
    return LanguageModel(c, arch) if arch in SINGLE_STACK else Seq2SeqTransformer(c)


def initialise(model, rule: str, batch: Callable) -> Dict:
    """Apply a named init rule; return every constant the residual style and the rule resolved.
    NormMLP has its own init (He normal, in its constructor) and no residual style."""
    if isinstance(model, NormMLP):
        return {"residual": None, "init": "kaiming_normal (model/normmlp.py)"}
    c = model.config
    stacks = [s for s in ("encoder", "decoder") if len(getattr(model, s))]
    has_norm = any(PLACEMENTS[c.placement(s)].has_norm for s in stacks)
    alpha = {"encoder": c.encoder_alpha, "decoder": c.decoder_alpha}
    placements = {s: c.placement(s) for s in stacks}
    # One name when every stack has the same placement; per stack for a hybrid.
    residual = c.residual if len(set(placements.values())) == 1 else placements
    constants: Dict = {"residual": residual, "init": rule,
                       "norm": model.config.norm if has_norm else None,
                       "qk_norm": model.config.qk_norm,
                       "alpha": {s: alpha[s] for s in stacks}}
    if "mix_ln" in placements.values():
        # Which layers are Post-LN: the bottom floor(a L) of each stack.
        constants["mix_ratio"] = c.mix_ratio
        constants["post_ln_layers"] = {s: sum(isinstance(layer.ffn, PostLN) for layer in getattr(model, s))
                                       for s in stacks}
    if c.norm == "dyt" and has_norm:
        constants["dyt_alpha"] = {"default": c.dyt_alpha, "attn": c.dyt_alpha_attn, "ffn": c.dyt_alpha_ffn,
                                  "final": c.dyt_alpha_final}
    constants.update(INIT_RULES[rule](model, batch))
    constants.update(initial_scalars(model))
    return constants


__all__ = ["Seq2SeqTransformer", "LanguageModel", "TransformerConfig", "NormMLP", "NormMLPConfig", "build_model",
           "initialise", "INIT_RULES"]
