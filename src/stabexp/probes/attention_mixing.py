"""What softmax attention does to the magnitude of its inputs: DeepNet's Lemma 1 (Wang et al. 2022,
arXiv 2203.00555, v1, Lemma 1). For values x_1..x_n of unit variance and any scores q,
softmax(q_1, ..., q_n) X has the magnitude of one input, so attention does not blow up the model
update and the bound of Theorem 4.1 can treat it like one linear map.

Per query t of an attention sublayer, the model's own weights w_tj (after the softmax, the mask
and, in training, the dropout: what `attn.mix` is handed) and values v_j give y_t = sum_j w_tj v_j,
and over the keys it mixes (w_tj > 0):

    gain_t  = ||y_t|| / mean_j ||v_j||   the output against one typical input (the lemma's Θ(1))
    bound_t = ||y_t|| / max_j ||v_j||    at most 1 for any weights that sum to 1 (a convex sum)
    peak_t  = max_j w_tj                 how far the softmax is from uniform (1/n) toward one key

Each is averaged over the real queries and the heads of the sublayer (bound: its largest), on
the probe batch in eval mode, at init and at the end of a completed run, into
attention_mixing.csv. At init the weights are near uniform and the gain falls like 1/sqrt(n) for
unrelated values; the lemma is about any scores, and after training, where a softmax picks out
few keys (a peak near 1), the gain could exceed 1 if the picked values are larger than typical.

Like every probe it watches the model through forward hooks: on each attention's `mix` inside
`explicit_attention()` (model/transformer.py), which the adapter's probe pass runs.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from stabexp.probes import hooked
from stabexp.probes.base import GATHER, PROBE_BATCH, STABEXP_MODEL, SUBLAYERS, Probe, Rows, refuse_unless

COLUMNS = ("gain", "bound", "peak")


def _mixing(weights: torch.Tensor, v: torch.Tensor, y: torch.Tensor, real: Optional[torch.Tensor]) -> torch.Tensor:
    """(gain, bound, peak) of one attention from its weights (B, h, T, S), values (B, h, S, d_h)
    and output (B, h, T, d_h); `real` (B, T) marks the real queries (None: all)."""
    kept = weights > 0
    v_norm = torch.linalg.vector_norm(v.float(), dim=-1)[:, :, None, :]    # (B, h, 1, S)
    y_norm = torch.linalg.vector_norm(y.float(), dim=-1)                   # (B, h, T)
    typical = (v_norm * kept).sum(-1) / kept.sum(-1).clamp(min=1)
    largest = torch.where(kept, v_norm, torch.zeros_like(v_norm)).amax(-1)
    gain, bound, peak = y_norm / typical, y_norm / largest, weights.float().amax(-1)
    if real is not None:
        keep = real[:, None, :].expand_as(gain)
        gain, bound, peak = gain[keep], bound[keep], peak[keep]
    return torch.stack([gain.mean(), bound.amax(), peak.mean()])


class AttentionMixing(Probe):
    """probe.attention_mixing: DeepNet's Lemma 1 per attention sublayer, at init and at the end
    of a completed run, into attention_mixing.csv (one row per attention sublayer)."""

    name = flag = "attention_mixing"
    needs = (SUBLAYERS, PROBE_BATCH, STABEXP_MODEL)
    # Read inside each attention's forward (its hooks see the gathered layer under FSDP2): every
    # rank computes the same rows, rank 0 writes them.
    combine = GATHER
    files = {"attention_mixing.csv": ("step", "stack", "layer", "sublayer", *COLUMNS)}

    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        refuse_unless(cls, cfg, cfg.model.arch != "normmlp", "reads attention sublayers, and model=normmlp has none")

    def at_init(self) -> Rows:
        return self._rows(0)

    def at_end(self, step: int) -> Rows:
        return self._rows(step)

    def _rows(self, step: int) -> Rows:
        ctx = self.ctx
        model, batch = ctx.model, ctx.probe_batch
        tokens = ctx.adapter.token_masks(batch)
        found: Dict[int, torch.Tensor] = {}
        sublayers = ctx.adapter.sublayers()

        def keep(i: int, real: Optional[torch.Tensor]):
            def hook(module, args, y):
                found[i] = _mixing(args[0].detach(), args[1].detach(), y.detach(), real)
            return hook

        attentions = list(model.attentions())
        hooks = [(attn.mix, "post", keep(i, tokens.get(sublayers[i].stack)))
                 for i, attn in enumerate(attentions) if attn is not None]
        with hooked(hooks):
            ctx.adapter.probe_pass(batch)
        order = sorted(found)
        values = torch.stack([found[i] for i in order]).tolist() if order else []
        rows: List[Dict] = [{"step": step, "stack": sublayers[i].stack, "layer": sublayers[i].layer,
                             "sublayer": sublayers[i].name, **dict(zip(COLUMNS, v))} for i, v in zip(order, values)]
        return Rows(files={"attention_mixing.csv": rows})
