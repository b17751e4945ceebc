"""The probes every run has on by default (probe.enabled): the model update ||F(x, theta_i) -
F(x, theta_0)|| and the output log Z in metrics.csv, and per residual sublayer its gradient norm,
ln_input_norm, stream_norm, largest attention logit and relative update in layers.csv
(formulas and citations: probes/__init__.py; columns: docs/outputs.md).

Gradient norms are this step's, taken before clipping (`before_step`); everything else is
measured on theta_i after the step, from one probe pass, and read back in one transfer.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from stabexp.probes import LayerProbe, log_z_stats, model_update
from stabexp.probes.base import PROBE_BATCH, REFERENCE, SUBLAYERS, SUM_OF_SQUARES, Probe, ProbeContext, Rows


def to_host(**tensors: torch.Tensor) -> Dict[str, List[float]]:
    """Every tensor as a list of floats, by name, from one device-to-host transfer."""
    flat = {name: t.float().reshape(-1) for name, t in tensors.items()}
    values = torch.cat(list(flat.values())).tolist()
    out, start = {}, 0
    for name, t in flat.items():
        out[name], start = values[start:start + t.numel()], start + t.numel()
    return out


def _cell(value: Optional[float]) -> Optional[float]:
    # An empty cell where a value does not exist: no norm on the stream, an FFN's attention
    # logit, the update at step 0.
    return value if value is not None and value == value else None


class SublayerStats(Probe):
    name = "layers"
    flag = "enabled"
    needs = (SUBLAYERS, PROBE_BATCH, REFERENCE)
    # Gradient norms and relative updates from local shards (LayerProbe); the probe pass runs
    # on FSDP's gathered weights.
    combine = SUM_OF_SQUARES
    metrics_columns = ("grad_norm", "model_update", "log_z_mean", "log_z_max")
    layers_columns = ("grad_norm", "ln_input_norm", "stream_norm", "max_attn_logit", "relative_update")

    def __init__(self, ctx: ProbeContext):
        super().__init__(ctx)
        self.layer_probe = LayerProbe(ctx.adapter, reduce=ctx.reduce_sum if ctx.sharded else None)
        self.grads = None      # (total, per sublayer) of the step being probed
        self.moved = False     # a snapshot of the weights before this step was taken

    def before_step(self, step: int) -> None:
        self.grads = self.layer_probe.grad_norms()
        self.layer_probe.snapshot()
        self.moved = True

    def measure(self, step: int) -> Rows:
        ctx, probe = self.ctx, self.layer_probe
        feats, ln_norms, max_logits, stream_norms, logits = probe.measure_pass(ctx.probe_batch)
        log_z = self._log_z(logits, feats)
        total, per_sublayer = self.grads if self.grads is not None else probe.grad_norms()
        relative = probe.relative_updates() if self.moved else torch.full_like(per_sublayer, float("nan"))
        self.grads, self.moved = None, False
        host = to_host(total=total, update=model_update(feats, ctx.features_init, ctx.probe_tokens),
                       log_z=log_z if log_z is not None else feats.new_zeros(0), grad=per_sublayer,
                       ln=ln_norms, logit=max_logits, relative=relative, stream=stream_norms)
        (grad_norm,), (update,) = host["total"], host["update"]
        log_z_mean, log_z_max = host["log_z"] or (None, None)  # empty cells where there are no logits
        sublayers = [{"grad_norm": g, "ln_input_norm": _cell(ln), "stream_norm": _cell(x),
                      "max_attn_logit": _cell(z), "relative_update": _cell(u)}
                     for g, ln, z, u, x in zip(host["grad"], host["ln"], host["logit"], host["relative"],
                                               host["stream"])]
        return Rows(metrics={"grad_norm": grad_norm, "model_update": update, "log_z_mean": log_z_mean,
                             "log_z_max": log_z_max}, sublayers=sublayers)

    @torch.no_grad()
    def _log_z(self, logits: Optional[torch.Tensor], feats: torch.Tensor) -> Optional[torch.Tensor]:
        """(mean, max) of log Z over the probe batch's real positions. A head with one row of
        logits per sequence (a classifier's (B, C)) is read over its sequences; a model that
        gives no logits (a bare encoder or seq2seq body, T5Model) leaves both cells empty."""
        ctx = self.ctx
        if logits is None:
            if not hasattr(ctx.model, "logits"):
                return None
            logits = ctx.model.logits(feats)
        # A classifier's (B, C): one row per sequence, whatever its tokens.
        return log_z_stats(logits, None if logits.dim() == 2 else ctx.probe_tokens)
