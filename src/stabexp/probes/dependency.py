"""Residual dependency (Liu et al. 2020, arXiv 2004.08249, Sec. 4.1 and its dependency figures;
Transformer-Clinic's `--plot_variance`): how much of each sublayer's output comes from its own
branch and how much from the embedding and every earlier branch.

Along one stack, the output x_i of residual sublayer i is a sum of parts, one per source: the
stack's input (the embedding, j = 0), each branch j <= i (a_j, what sublayer j adds to the
stream) and, once a norm has a bias, that bias (j = -1). Each part is carried exactly through
everything the stream goes through: DeepNorm's alpha, Admin's omega, and each norm on the stream
(LayerNorm: the part's own per-token mean removed, times the gain over the norm's common sigma of
that token; RMSNorm: times the gain over the token's RMS). So sum_j part_ij = x_i to rounding
(`decompose`, tested), and

    beta_ij = sqrt(mean over tokens of Var_d(part_ij)) / sqrt(mean over tokens of Var_d(x_i)),

the share of x_i's per-token spread that source j carries; beta_ii is the dependency on the
sublayer's own branch. With near-orthogonal parts sum_j beta_ij^2 is about 1 (the cross terms
are what is left). Clinic prints the per-token std of every part, multiplied by the norms' gains
(and omega) but not by their 1/sigma, averaged over tokens, and normalises each row to plot it;
this is the same quantity without that approximation.

Like every probe it watches the model through forward hooks on the residual sublayers and their
stream norm `ln` (model/transformer.py). A placement with a norm after the sum (Post-LN, DeepNorm,
Admin, ReZero-Post-LN) is recognised by its output being its `ln`'s output; for the others the
branch part is what the sublayer added, output minus input. DLCL's dense layer history mixes
whole layer outputs between sublayers and is not decomposed.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.nn as nn

from stabexp.model.placements import Admin, DeepNorm, Residual
from stabexp.modes import eval_mode
from stabexp.probes import hooked
from stabexp.config import model_norm, placements as stack_placements
from stabexp.probes.base import GATHER, PROBE_BATCH, STABEXP_MODEL, SUBLAYERS, Probe, Rows, refuse_unless

BIAS = -1  # the component of the norms' biases


def stream_scale(res: Residual):
    """What a norm-after-sum placement multiplies the stream by before adding its branch:
    Admin's omega, DeepNorm's alpha, else 1 (the formulas in model/placements.py)."""
    if isinstance(res, Admin):
        return res.omega
    if isinstance(res, DeepNorm):
        return res.alpha
    return 1.0


def _through_norm(parts: List[torch.Tensor], z: torch.Tensor, norm: nn.Module) -> List[torch.Tensor]:
    """Each part of z = sum(parts) carried through `norm` (LayerNorm or RMSNorm), so that the
    carried parts sum to norm(z) minus its bias."""
    z = z.float()
    if isinstance(norm, nn.LayerNorm):
        sigma = torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + norm.eps)
        gain = norm.weight / sigma if norm.weight is not None else 1.0 / sigma
        return [(p - p.mean(-1, keepdim=True)) * gain for p in parts]
    if isinstance(norm, nn.RMSNorm):
        eps = norm.eps if norm.eps is not None else torch.finfo(z.dtype).eps
        rms = torch.sqrt(z.pow(2).mean(-1, keepdim=True) + eps)
        gain = norm.weight / rms if norm.weight is not None else 1.0 / rms
        return [p * gain for p in parts]
    raise TypeError(f"cannot carry a decomposition through {type(norm).__name__}")


def supports(model) -> Optional[str]:
    """None when the model's stacks can be decomposed; else why not (one line)."""
    if getattr(model, "encoder_history", None) is not None or getattr(model, "decoder_history", None) is not None:
        return "DLCL's dense layer history mixes whole layer outputs, which this decomposition does not follow"
    return None


@torch.no_grad()
def decompose(model, src: torch.Tensor, tgt_in: torch.Tensor) -> List[Dict]:
    """One forward pass in eval mode; per residual sublayer in `model.residuals()` order:
    {"stack", "index" (1-based in its stack), "output": x_i, "parts": {j: part_ij}}."""
    why_not = supports(model)
    if why_not is not None:
        raise ValueError(why_not)
    residuals = list(model.residuals())
    results: List[Dict] = []
    state: Dict[str, Dict] = {}  # per stack: its parts so far
    seen: Dict[str, torch.Tensor] = {}          # the current sublayer's input x and norm input z
    norm_outputs: Dict[int, torch.Tensor] = {}  # the last output of each stream norm, by module id

    def keep_input(module, args):
        seen["x"] = args[0]

    def keep_norm_input(module, args):
        seen["z"] = args[0]

    def after(stack: str, res: Residual):
        def hook(module, args, y):
            x = seen.pop("x").float()
            z = seen.pop("z", None)
            if stack not in state:
                state[stack] = {"parts": {0: x}, "count": 0}
            s = state[stack]
            s["count"] += 1
            i = s["count"]
            parts = s["parts"]
            ln = getattr(res, "ln", None)
            if ln is not None and z is not None and y is norm_outputs.get(id(ln)):
                scale = stream_scale(res)
                scaled = {j: p * scale for j, p in parts.items()}
                branch = z.float() - x * scale
                keys = list(scaled) + [i]
                carried = _through_norm([scaled[j] for j in scaled] + [branch], z, ln)
                parts = dict(zip(keys, carried))
                bias = getattr(ln, "bias", None)
                if bias is not None:  # earlier biases were carried with the rest; this one adds
                    # A copy: under FSDP2 the layer's gathered bias is freed after its forward.
                    parts[BIAS] = parts[BIAS] + bias if BIAS in parts else bias.float().clone().expand_as(y)
            else:
                parts = {**parts, i: y.float() - x}
            s["parts"] = parts
            results.append({"stack": stack, "index": i, "output": y.float(), "parts": dict(parts)})
        return hook

    def remember_output(module, args, out):
        norm_outputs[id(module)] = out

    hooks = []
    for stack, _, _, res in residuals:
        hooks.append((res, "pre", keep_input))
        hooks.append((res, "post", after(stack, res)))
        ln = getattr(res, "ln", None)
        if ln is not None:
            hooks.append((ln, "pre", keep_norm_input))
            hooks.append((ln, "post", remember_output))
    with eval_mode(model), hooked(hooks):
        model.features(src, tgt_in)
    return results


def _spread(t: torch.Tensor, tokens: Optional[torch.Tensor]) -> torch.Tensor:
    """sqrt(mean over (real) tokens of the per-token variance over features)."""
    var = t.var(-1, unbiased=False)
    return (var.mean() if tokens is None else var[tokens].mean()).sqrt()


@torch.no_grad()
def dependency(model, src: torch.Tensor, tgt_in: torch.Tensor) -> List[Dict]:
    """Tidy rows {stack, sublayer (i), component (j), beta} of every residual sublayer's
    decomposition on one batch; padded positions (a task with pad_id) are left out."""
    masks = model.token_masks(src, tgt_in)
    rows, values = [], []
    for entry in decompose(model, src, tgt_in):
        tokens = masks.get(entry["stack"])
        total = _spread(entry["output"], tokens)
        for j, part in sorted(entry["parts"].items()):
            rows.append({"stack": entry["stack"], "sublayer": entry["index"], "component": j})
            values.append(_spread(part, tokens) / total)
    betas = torch.stack(values).tolist() if values else []  # one host sync
    return [{**row, "beta": beta} for row, beta in zip(rows, betas)]


class Dependency(Probe):
    """probe.dependency: every sublayer's residual dependency on the probe batch, at init and at
    the end of a completed run, into dependency.csv."""

    name = flag = "dependency"
    needs = (SUBLAYERS, PROBE_BATCH, STABEXP_MODEL)
    # Read from activations inside each layer's forward (its hooks see the gathered layer under
    # FSDP2): every rank computes the same rows, rank 0 writes them.
    combine = GATHER
    files = {"dependency.csv": ("step", "stack", "sublayer", "component", "beta")}

    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        norm, placements = model_norm(cfg), stack_placements(cfg)
        refuse_unless(cls, cfg, cfg.model.arch != "normmlp", "decomposes residual sublayers, and model=normmlp has none")
        refuse_unless(cls, cfg, "dlcl" not in placements,
                      "group.residual=dlcl mixes whole layer outputs, which the decomposition does not follow")
        refuse_unless(cls, cfg, not placements & {"hybridnorm", "hybridnorm_star"},
                      "HybridNorm adds its FFN branch to the normalised stream, LN(x) + G, which the "
                      "decomposition does not follow")
        refuse_unless(cls, cfg, norm != "dyt",
                      "model.norm=dyt: a tanh does not carry a sum of parts through it as a norm does")

    def at_init(self) -> Rows:
        return self._rows(0)

    def at_end(self, step: int) -> Rows:
        return self._rows(step)

    def _rows(self, step: int) -> Rows:
        rows = dependency(self.ctx.model, *self.ctx.probe_batch)
        return Rows(files={"dependency.csv": [{"step": step, **r} for r in rows]})
