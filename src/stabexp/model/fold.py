"""Admin folded back into a plain Post-LN model (Liu et al. 2020, arXiv 2004.08249: Admin "can be
reparameterized into the original Transformer", Transformer-Clinic and admin-torch READMEs; the
construction is not spelled out there, this is one that is exact).

Admin's sublayer i computes y_i = LN_i(omega_i * x + G_i(x)) with x = y_{i-1} = LN_{i-1}(...).
A Post-LN sublayer computes LN_i(x' + G'_i(x')). Take x' = omega_i * x: it is LN_{i-1}'s output
with gain and bias times omega_i, and G'_i(x') = G_i(x) when the branch's input projections
(W_Q, W_K, W_V of a self-attention, W_Q of a cross-attention, whose keys and values read the
encoder output, and W_1 of an FFN) have their input columns divided by omega_i. So every omega
but the first of each stack goes into the LN below it.

The first sublayer's x is the embedding, E[token] sqrt(d) + P. Folding omega_1 into E would need
the sinusoidal positions P scaled too (they are fixed), and E is tied with the output projection
and shared by both stacks, which have different omega_1. So omega_1 stays, as one per-dimension
scale on each stack's input (`TransformerConfig.input_scale`); where every omega_1 is exactly 1
(Admin's profiling starts each stack at 1, so an untrained model) there is none and the result is
a plain Post-LN model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List

import torch

from stabexp.model.placements import Admin
from stabexp.model.transformer import CrossAttention, FeedForward, SelfAttention


def _input_projections(branch) -> List[torch.Tensor]:
    """The weights of a branch that read the stream (their input columns are its features)."""
    if isinstance(branch, SelfAttention):
        return [branch.qkv.weight]
    if isinstance(branch, CrossAttention):
        return [branch.q.weight]
    if isinstance(branch, FeedForward):
        return [branch.fc1.weight]
    raise TypeError(f"no input projection known for {type(branch).__name__}")


def _stacks(model) -> Dict[str, list]:
    stacks: Dict[str, list] = {}
    for stack, _, _, res in model.residuals():
        stacks.setdefault(stack, []).append(res)
    return stacks


@torch.no_grad()
def admin_to_postln(model):
    """A new model with residual "postln" whose outputs equal `model`'s (an Admin model: every
    sublayer's placement is admin) to rounding; `model` is left as it is."""
    stacks = _stacks(model)
    if not all(isinstance(res, Admin) for subs in stacks.values() for res in subs):
        raise ValueError("only a model whose every residual sublayer is Admin's can be folded into Post-LN")
    first = {stack: subs[0].omega.detach() for stack, subs in stacks.items()}
    keeps_input_scale = any(bool((w != 1).any()) for w in first.values())
    c = replace(model.config, residual="postln", encoder_residual=None, decoder_residual=None,
                input_scale=keeps_input_scale)
    folded = type(model)(c, model.arch) if hasattr(model, "arch") else type(model)(c)
    source = {k: v for k, v in model.state_dict().items() if not k.endswith(".omega")}
    missing, unexpected = folded.load_state_dict(source, strict=False)
    assert not unexpected and all(k.startswith("input_scale.") for k in missing), (missing, unexpected)
    folded_stacks = _stacks(folded)
    for stack, subs in stacks.items():
        targets = folded_stacks[stack]
        for i, (res, target) in enumerate(zip(subs, targets)):
            omega = res.omega.detach()
            for w in _input_projections(target.branch):
                w.div_(omega)                      # columns: the stream's features
            if i == 0:
                if keeps_input_scale:
                    folded.input_scale[stack].copy_(omega)
                continue
            below = targets[i - 1].ln
            below.weight.mul_(omega)
            if getattr(below, "bias", None) is not None:
                below.bias.mul_(omega)
    return folded
