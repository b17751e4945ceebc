"""DeepNet's bound on the model update, measured (Wang et al. 2022, arXiv 2203.00555, Sec. 4.2).

Theorem 4.1: for an N-layer stack whose 2N sublayers are x_{l+1} = LN(alpha x_l + G_l(x_l)),
each branch treated as G = v w x (v, w the scales of W_V and W_O in the self-attention, of W_1
and W_2 in the FFN),

    ||F(x, theta*) - F(x, theta)|| <= sum_i sqrt(v_i^2 + w_i^2) / alpha * ||theta*_i - theta_i||.

Post-LN is the case alpha = 1. DeepNet chooses alpha and the init gain beta (v = w = beta at
init) so that this sum stays O(1) as N grows; a fixed-size update of every sublayer then moves F
by O(1), where Post-LN's sum grows with N.

The theorem's G is a scalar map; for matrices the reading that keeps its inequality is the
operator (spectral) norm, and it is this probe's: v_i = ||W_V||_2 and w_i = ||W_O||_2 (W_1, W_2 in
the FFN) at theta_t, and ||theta*_i - theta_i|| = sqrt(||dW_V||_2^2 + ||dW_O||_2^2) between theta_0
and theta_t, the pair the model update ||F(x, theta_t) - F(x, theta_0)|| is measured between; to
first order ||d(W_O W_V)|| <= ||W_O|| ||dW_V|| + ||dW_O|| ||W_V||, Cauchy-Schwarz gives the
theorem's product, and the norm after each sublayer divides by alpha. W_Q, W_K, the biases and the
norms' gains are not variables of the theorem and are left out.
A second reading is kept beside it, the one of the paper's own words (the "scale" of a matrix as
its init gain): v = ||W||_F / xi, xi = sqrt(2 fan_in fan_out / (fan_in + fan_out)) the Frobenius
norm of a Xavier-normal matrix of gain 1 (v = beta at DeepNorm's init, 1 / k_l at Post-LN-init's),
and the change ||dW||_F / xi in the same units: the columns *_gain. It ignores how an update lines
up with the input, so it can fall below the measured update.
The bound is a statement about a normalised F, so it is compared with the model update relative
to F's own size: model_update / ||F(x, theta_0)|| per token (stabexp.analysis,
`update_bound_table`).

Theorem 4.3, the encoder-decoder form, is built from the same pieces. The encoder's output
F_e is bounded as above with alpha_e over its 2N sublayers; each decoder cross-attention carries
a change of F_e into the decoder through its V and O, a gain v_c w_c / alpha_d (G = v w F_e: the
product, not the root of the squares, since the input moves and not the weights); and the 3M
decoder sublayers add their own terms with alpha_d:

    ||dF_ed|| <= sum_j^M v_cj w_cj / alpha_d * sum_i^2N sqrt(v_ei^2 + w_ei^2) / alpha_e ||dtheta_ei||
                 + sum_j^3M sqrt(v_dj^2 + w_dj^2) / alpha_d ||dtheta_dj||.

The rows are the same for both forms (a cross-attention row's term is its own parameter change's
part, v and w its V and O); the sums are stabexp.analysis's (`update_bound_steps`).

One file, update_bound.csv: a row per (probe step, sublayer) with alpha, v, w, the parameter
change and the sublayer's term of the sum, in both readings.
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

import torch

from stabexp.config import placements as stack_placements
from stabexp.distributed import local, sharded_like
from stabexp.probes import read_with
from stabexp.probes.base import REFERENCE, STABEXP_MODEL, SUBLAYERS, GATHER, Probe, ProbeContext, Rows, refuse_unless
from stabexp.probes.statistics import per_token_norm

COLUMNS = ["step", "stack", "layer", "sublayer", "alpha", "v", "w", "param_change", "term",
           "v_gain", "w_gain", "param_change_gain", "term_gain"]
# The two matrices of each sublayer's G = v w x (DeepNet Sec. 4.2).
SCALED = {"self_attn": ("v", "o"), "cross_attn": ("v", "o"), "ffn": ("w1", "w2")}


def xavier_norm(w: torch.Tensor) -> float:
    """Expected Frobenius norm of a Xavier-normal matrix of gain 1 with w's shape."""
    fan_out, fan_in = w.shape
    return math.sqrt(2.0 * fan_in * fan_out / (fan_in + fan_out))


class UpdateBound:
    """The terms of Theorem 4.1 (a single stack) or 4.3 (encoder-decoder), sublayer by sublayer.

    Under FSDP2 (`sharded`) a spectral norm is not a sum over row shards, and V is a slice of
    the fused QKV projection, whose rows the shards split anywhere: theta_0 is kept as each
    rank's shards of the branches' weight parameters, and at a probe step each sublayer's
    parameters, now and at theta_0, are gathered whole, one sublayer at a time (never the model),
    and read through the branch's own `matrices()`."""

    def __init__(self, model, sharded: bool = False):
        self.sharded = sharded
        self.keys: List[Tuple[str, int, str]] = []
        self.alphas: List[float] = []
        self.matrices: List[torch.Tensor] = []  # (V, O) or (W_1, W_2) of each sublayer, in order
        self.branches: List[Tuple[torch.nn.Module, str, Dict[str, torch.Tensor]]] = []  # sharded
        for stack, layer, name, res in model.residuals():
            self.keys.append((stack, layer, name))
            self.alphas.append(float(getattr(res, "alpha", 1.0)))  # DeepNorm's alpha; Post-LN's 1
            if sharded:
                weights = {n: p for n, p in res.branch.named_parameters() if p.dim() >= 2}
                self.branches.append((res.branch, name, weights))
                shapes = _scaled(res.branch, name, {n: torch.empty(p.shape, device="meta") for n, p in weights.items()})
                self.matrices += [torch.empty(m.shape, device="meta") for m in shapes]
            else:
                mats = res.branch.matrices()
                self.matrices += [mats[k] for k in SCALED[name]]
        self.xi = torch.tensor([xavier_norm(w) for w in self.matrices])
        # theta_0, taken now; a resumed run loads the checkpoint's copy into it (load_state_dict).
        self.init = ([local(p).detach().clone() for *_, weights in self.branches for p in weights.values()]
                     if sharded else [w.detach().clone() for w in self.matrices])

    @torch.no_grad()
    def rows(self, step: int) -> List[Dict]:
        spectral, frobenius = self._sharded_norms() if self.sharded else self._norms()
        n = len(self.matrices)
        values = torch.stack([spectral[:n], spectral[n:], frobenius[:n] / self.xi, frobenius[n:] / self.xi])
        alpha = torch.tensor(self.alphas)
        rows = [{"step": step, "stack": stack, "layer": layer, "sublayer": name, "alpha": a}
                for (stack, layer, name), a in zip(self.keys, self.alphas)]
        for suffix, scales, moved in (("", values[0], values[1]), ("_gain", values[2], values[3])):
            scale, change = scales.view(-1, 2), moved.view(-1, 2).pow(2).sum(1).sqrt()
            term = scale.pow(2).sum(1).sqrt() / alpha * change
            for row, (v, w), c, t in zip(rows, scale.tolist(), change.tolist(), term.tolist()):
                row.update({f"v{suffix}": v, f"w{suffix}": w, f"param_change{suffix}": c, f"term{suffix}": t})
        return rows

    def _norms(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(spectral, Frobenius) norms of the matrices, then of their changes since theta_0."""
        current = [w.detach() for w in self.matrices]
        both = current + list(torch._foreach_sub(current, self.init))
        return _spectral_norms(both).cpu(), torch.stack(torch._foreach_norm(both)).float().cpu()

    def _sharded_norms(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """`_norms` under FSDP: each sublayer's parameters, now and at theta_0, gathered whole
        and read through its branch's `matrices()`, their norms taken before the next one's."""
        init = iter(self.init)
        spectral, frobenius = [], []
        for branch, name, weights in self.branches:
            current = _scaled(branch, name, {n: p.full_tensor() for n, p in weights.items()})
            initial = _scaled(branch, name, {n: sharded_like(next(init), p).full_tensor() for n, p in weights.items()})
            both = current + list(torch._foreach_sub(current, initial))
            spectral.append(_spectral_norms(both).cpu())
            frobenius.append(torch.stack(torch._foreach_norm(both)).float().cpu())
        # Per sublayer (now: V, O; change: V, O) -> the order of `_norms`: all now, all changes.
        spectral, frobenius = torch.stack(spectral), torch.stack(frobenius)
        return (torch.cat([spectral[:, :2].flatten(), spectral[:, 2:].flatten()]),
                torch.cat([frobenius[:, :2].flatten(), frobenius[:, 2:].flatten()]))


def _scaled(branch: torch.nn.Module, name: str, weights: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
    """The two matrices of G = v w x of a sublayer, read from the parameters `weights`."""
    mats = read_with(branch, "matrices", weights)
    return [mats[k] for k in SCALED[name]]


def _spectral_norms(matrices: List[torch.Tensor]) -> torch.Tensor:
    """||W||_2 of each matrix, one batched call per shape (V and O are d x d, W_1 and W_2 not)."""
    out = torch.empty(len(matrices), device=matrices[0].device)
    by_shape: Dict[Tuple[int, ...], List[int]] = {}
    for k, w in enumerate(matrices):
        by_shape.setdefault(tuple(w.shape), []).append(k)
    for ks in by_shape.values():
        out[ks] = torch.linalg.matrix_norm(torch.stack([matrices[k] for k in ks]).float(), ord=2)
    return out


class UpdateBoundProbe(Probe):
    """probe.update_bound: the rows of update_bound.csv at every probe step, and at init
    ||F(x, theta_0)|| per token (summary.json's `features_init_norm`), which the relative model
    update divides by (stabexp.analysis, `update_bound_table`)."""

    name = flag = "update_bound"
    needs = (SUBLAYERS, REFERENCE, STABEXP_MODEL)
    combine = GATHER  # each sublayer's parameters gathered whole, one sublayer at a time
    files = {"update_bound.csv": COLUMNS}

    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        refuse_unless(cls, cfg, cfg.probe.enabled, "needs probe.enabled=true")
        placements = stack_placements(cfg)
        refuse_unless(cls, cfg, cfg.model.arch != "normmlp" and placements <= {"postln", "deepnorm"},
                      f"DeepNet's Theorems 4.1 and 4.3 bound stacks of x <- LN(alpha x + G(x)): group.residual "
                      f"postln or deepnorm on a Transformer (here {cfg.model.arch}, {', '.join(sorted(placements))})")

    def __init__(self, ctx: ProbeContext):
        super().__init__(ctx)
        self.bound = UpdateBound(ctx.model, sharded=ctx.sharded)

    def at_init(self) -> None:
        self.ctx.summary["features_init_norm"] = per_token_norm(self.ctx.features_init, self.ctx.probe_tokens).item()

    def measure(self, step: int) -> Rows:
        return Rows(files={"update_bound.csv": self.bound.rows(step)})

    def state_dict(self) -> Dict:
        if self.ctx.sharded:  # each rank's shards, as DTensors: the checkpoint saves them with DCP
            params = [p for *_, weights in self.bound.branches for p in weights.values()]
            return {"update_bound_init": [sharded_like(t, p) for t, p in zip(self.bound.init, params)]}
        return {"update_bound_init": self.bound.init}

    def load_state_dict(self, state: Dict) -> None:
        self.bound.init = [local(w).to(self.ctx.device) for w in state["update_bound_init"]]
