"""QK-Clip (Kimi Team 2025, "Kimi K2", arXiv 2507.20534, Sec. 2.1, MuonClip): after each
optimiser step, every attention head h whose largest logit of that step's forward,
S_max^h = max_ij q_i.k_j / sqrt(d_h) over the batch (every batch of the step, with
train.update_freq > 1), went above tau has its W_q^h and W_k^h
(and their biases) multiplied by sqrt(gamma_h), gamma_h = min(1, tau / S_max^h), so that the
same input would give logits of at most tau. The optimiser's state is left as it is.

The logits are read the way the probes read them: a forward hook on each attention's `scores`
inside `explicit_attention()` (model/transformer.py), here around the training forward, so a
run with QK-Clip computes attention by hand rather than with the fused kernel.

The rescaling is a factor per row of the parameters W_q and W_k are rows of (the fused QKV
projection, say): under FSDP2, whose shards are rows, each rank scales the rows it holds. On K
ranks every replica clips by the largest logit of the global batch.

It steers the step from outside the loop, as a StepHook (train/hooks.py): around the training
forward it keeps the logits, after the optimiser step it clips.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Dict, List, Tuple

import torch
import torch.nn as nn

from stabexp import distributed, plugins
from stabexp.config import placements
from stabexp.errors import need
from stabexp.distributed import local, local_part
from stabexp.model.transformer import explicit_attention
from stabexp.probes import hooked, read_with
from stabexp.train.hooks import StepHook


class QKClip(StepHook):
    name = "qk_clip"

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.train.qk_clip_tau > 0

    @classmethod
    def check(cls, cfg) -> None:
        tau, m, tr = cfg.train.qk_clip_tau, cfg.model, cfg.train
        need(cfg.task.kind != "translation", "train.qk_clip_tau", tau,
             "takes each head's largest logit over every query, and padded translation batches have "
             "queries no loss reads: language-model and synthetic tasks only")
        need(m.arch != "normmlp", "train.qk_clip_tau", tau, "clips attention, and model=normmlp has none")
        need(not m.qk_norm and not any(plugins.placement(x).qkv_norm for x in placements(cfg)),
             "train.qk_clip_tau", tau, "scales W_q and W_k, which normalised q and k (model.qk_norm, "
             "hybridnorm) do not feel")
        need(not tr.activation_checkpointing and not tr.compile, "train.qk_clip_tau", tau,
             "reads each step's logits by hook, which train.activation_checkpointing and train.compile do not run")

    @classmethod
    def from_config(cls, model: nn.Module, cfg) -> "QKClip":
        return cls(model, cfg.train.qk_clip_tau)

    def __init__(self, model: nn.Module, tau: float):
        self.tau = tau
        self.attentions: List[nn.Module] = [a for a in model.attentions() if a is not None]
        self.rows = [query_key_rows(a) for a in self.attentions]
        self.max_logits: List[torch.Tensor] = []

    def _hook(self, i: int):
        def keep_max(module, inputs, logits):
            # (B, h, T, S) -> the largest logit of each head over batch, queries and keys; with
            # activation checkpointing the forward runs twice, and the max is the same.
            self.max_logits[i] = torch.maximum(self.max_logits[i], logits.detach().amax(dim=(0, 2, 3)))
        return keep_max

    def around_forward(self, ctx):
        return self.observing()

    def after_optimizer_step(self, ctx) -> None:
        if distributed.world() > 1:  # every replica clips by the largest logit of the global batch
            self.max_logits = list(distributed.max_(torch.stack(self.max_logits)))
        self.clip()

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
        for attention, rows, s_max in zip(self.attentions, self.rows, self.max_logits):
            gamma = (self.tau / s_max.clamp(min=torch.finfo(s_max.dtype).tiny)).clamp(max=1.0)
            d_head = attention.out.weight.shape[0] // attention.n_heads
            scale = gamma.sqrt().repeat_interleave(d_head)  # one factor per row of W_q, W_k
            for param, param_rows, positions in rows:
                factor = torch.ones(param.shape[0], device=scale.device, dtype=scale.dtype)
                factor[param_rows] = scale[positions]  # x 1 elsewhere (W_v's rows): exact
                local(param).mul_(local_part(factor, param).view(-1, *[1] * (param.dim() - 1)))


def query_key_rows(attention: nn.Module) -> List[Tuple[nn.Parameter, torch.Tensor, torch.Tensor]]:
    """(parameter, its rows that are rows of W_q, W_k or their biases, the position of each in
    W_q or W_k) for every parameter holding some: read through the attention's own matrices()
    and biases() from stand-ins whose entries number the parameter and the row."""
    params = [p for _, p in attention.named_parameters()]
    stride = max(p.shape[0] for p in params)
    numbered = {name: (torch.arange(p.shape[0]) + j * stride).view(-1, *[1] * (p.dim() - 1)).expand(p.shape)
                for j, (name, p) in enumerate(attention.named_parameters())}
    matrices, biases = read_with(attention, "matrices", numbered), read_with(attention, "biases", numbered)
    rows: Dict[int, Tuple[List[torch.Tensor], List[torch.Tensor]]] = {}
    for part in (matrices, biases):
        for key in ("q", "k"):
            if key in part:
                ids = part[key].flatten(1)[:, 0] if part[key].dim() > 1 else part[key]
                for j in ids.div(stride, rounding_mode="floor").unique().tolist():
                    mine = ids // stride == j
                    rows.setdefault(j, ([], []))
                    rows[j][0].append(ids[mine] % stride)
                    rows[j][1].append(torch.arange(len(ids))[mine])
    device = params[0].device
    return [(params[j], torch.cat(r).to(device), torch.cat(pos).to(device)) for j, (r, pos) in sorted(rows.items())]
