"""The encoder-decoder Transformer (transformer.py, with the residual placements of placements.py
and the norms of norms.py), the decoder-only and encoder-only models (lm.py), their named init
rules (init.py); the normalised network of the SMD study (normmlp.py).
Placements and init rules are looked up by name or dotted path through stabexp.plugins."""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

from stabexp import plugins
from stabexp.errors import ConfigError
from stabexp.model.init import INIT_RULES, deepnorm_constants, initial_scalars
from stabexp.model.lm import SINGLE_STACK, LanguageModel
from stabexp.model.normmlp import NormMLP, NormMLPConfig
from stabexp.model.norms import NORM_TYPES
from stabexp.model.placements import PostLN, Residual
from stabexp.model.transformer import Seq2SeqTransformer
from stabexp.config import model_norm
from stabexp.model_options import TransformerConfig, model_options


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
    has_norm = any(plugins.placement(c.placement(s)).has_norm for s in stacks)
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
    resolved = plugins.init_rule(rule)(model, batch)
    if not isinstance(resolved, dict):
        raise ConfigError(f"group.init={rule} is not allowed: it returned {plugins.what_is(resolved)}, "
                          "not a dict of the constants it resolved")
    constants.update(resolved)
    constants.update(initial_scalars(model))
    return constants


# The model a user's placement is tried on: one layer per stack, d_model 8, a batch of 2 x 5.
TRIAL_MODEL = {"vocab_size": 8, "d_model": 8, "ffn_dim": 16, "n_heads": 2, "max_len": 16}


def check_placement(name: str) -> None:
    """A placement from outside the package (stabexp.plugins), tried once before a run uses it:
    a tiny model built with it (an encoder-decoder, or a decoder-only model when the placement
    is for one stack) runs a forward of the right shape; a sublayer whose class says `has_norm`
    holds a norm outside its branch. Raises plugins.Rejected with what went wrong. The global
    random state is left as it was."""
    p = plugins.placement(name)
    one_stack = not p.encoder_decoder
    c = TransformerConfig(**TRIAL_MODEL, encoder_layers=0 if one_stack else 1, decoder_layers=1, residual=name)
    tokens = torch.arange(10).remainder(TRIAL_MODEL["vocab_size"]).view(2, 5)
    with torch.random.fork_rng(devices=[]):
        try:
            model = LanguageModel(c, "decoder_only") if one_stack else Seq2SeqTransformer(c)
        except Exception as err:
            raise plugins.Rejected(f"building a model with it fails: {plugins.one_line(err)}") from None
        try:
            with torch.no_grad():
                features = model.eval().features(tokens, tokens)
        except Exception as err:
            raise plugins.Rejected(f"a forward of a model with it (d_model 8, one layer per stack) fails: "
                                   f"{plugins.one_line(err)}") from None
    if tuple(features.shape) != (2, 5, TRIAL_MODEL["d_model"]):
        raise plugins.Rejected(f"a model with it gives features of shape {tuple(features.shape)}, not (2, 5, 8) "
                               "for a batch of 2 sequences of 5 tokens at d_model 8")
    for stack, layer, sublayer, res in model.residuals():
        where = f"{stack} layer {layer} {sublayer}"
        if not isinstance(res, Residual) or not isinstance(getattr(res, "branch", None), torch.nn.Module) \
                or not hasattr(res, "drop"):
            raise plugins.Rejected(f"its {where} has no `branch` and `drop`: its __init__ must call "
                                   "Residual.__init__(branch, c, stack, shared, layer)")
        inside = {id(m) for m in res.branch.modules()}
        if type(res).has_norm and not any(isinstance(m, NORM_TYPES) and id(m) not in inside for m in res.modules()):
            raise plugins.Rejected(f"its {where} holds no norm outside its branch, yet its class says has_norm: "
                                   "make the norm with make_norm(c.norm, c.d_model), or set has_norm = False")


__all__ = ["Seq2SeqTransformer", "LanguageModel", "TransformerConfig", "NormMLP", "NormMLPConfig", "build_model",
           "initialise", "check_placement", "INIT_RULES"]
