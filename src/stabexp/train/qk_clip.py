"""QK-Clip (Kimi Team 2025, "Kimi K2", arXiv 2507.20534, Sec. 2.1, MuonClip): after each
optimiser step, every attention head h whose largest logit of that step's forward,
S_max^h = max_ij q_i.k_j / sqrt(d_h) over the batch, went above tau has its W_q^h and W_k^h
(and their biases) multiplied by sqrt(gamma_h), gamma_h = min(1, tau / S_max^h), so that the
same input would give logits of at most tau. The optimiser's state is left as it is.

The logits are read the way the probes read them: a forward hook on each attention's `scores`
inside `explicit_attention()` (model/transformer.py), here around the training forward, so a
run with QK-Clip computes attention by hand rather than with the fused kernel.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import List

import torch
import torch.nn as nn

from stabexp.model.transformer import explicit_attention
from stabexp.probes import hooked


class QKClip:
    def __init__(self, model: nn.Module, tau: float):
        self.tau = tau
        self.attentions: List[nn.Module] = [a for a in model.attentions() if a is not None]
        self.max_logits: List[torch.Tensor] = []

    def _hook(self, i: int):
        def keep_max(module, inputs, logits):
            # (B, h, T, S) -> the largest logit of each head over batch, queries and keys; with
            # activation checkpointing the forward runs twice, and the max is the same.
            self.max_logits[i] = torch.maximum(self.max_logits[i], logits.detach().amax(dim=(0, 2, 3)))
        return keep_max

    @contextmanager
    def observing(self):
        """Around a training forward: each head's largest logit of the step is kept."""
        self.max_logits = [torch.full((a.n_heads,), float("-inf"), device=a.out.weight.device)
                           for a in self.attentions]
        with ExitStack() as stack:
            stack.enter_context(explicit_attention())
            stack.enter_context(hooked([(a.scores, "post", self._hook(i)) for i, a in enumerate(self.attentions)]))
            yield

    @torch.no_grad()
    def clip(self) -> None:
        """After the optimiser step: W_q^h, W_k^h times sqrt(min(1, tau / S_max^h))."""
        for attention, s_max in zip(self.attentions, self.max_logits):
            gamma = (self.tau / s_max.clamp(min=torch.finfo(s_max.dtype).tiny)).clamp(max=1.0)
            d_head = attention.out.weight.shape[0] // attention.n_heads
            scale = gamma.sqrt().repeat_interleave(d_head)  # one factor per row of W_q, W_k
            matrices, biases = attention.matrices(), attention.biases()
            for key in ("q", "k"):
                matrices[key].mul_(scale[:, None])
                if key in biases:
                    biases[key].mul_(scale)
