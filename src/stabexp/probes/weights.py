"""Weight-norm dynamics of every weight matrix (spherical motion dynamics, Wan et al. 2021;
rotational equilibrium, Kosson et al. 2023; docs/methods.md, "Probes").

- weight_norm ||w_t||;
- angular_update Delta_t = arccos(<w_t, w_{t+1}> / (||w_t|| ||w_{t+1}||)), computed without the
  arccos (see `angle`), and its mean over the rows (output neurons) of the matrix;
- effective_lr, the step size that a scale-invariant weight actually feels: eta / ||w_t||^2 under
  SGD, eta / ||w_t|| under Adam (theory.effective_lr);
- scale_invariant: whether scaling the weight leaves the model's output unchanged (tested, not
  assumed, on the model at hand);
- grad_cosine, the cosine between a weight and its gradient at the step (Wan et al. 2021,
  Property 1: 0 for a scale-invariant weight), and at init, into the summary, how far the
  gradient of the scale-invariant weights is from Property 2's grad L(kw) = grad L(w) / k.
Theory values for these: stabexp/theory.py.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from stabexp import theory
from stabexp.distributed import local
from stabexp.modes import eval_mode
from stabexp.probes.base import PROBE_BATCH, SUM_OF_SQUARES, Probe, ProbeContext, Rows, refuse_unless

Key = Tuple[str, int, str, str]  # (stack, layer, sublayer, param)


def angle(a: torch.Tensor, b: torch.Tensor, dim=None) -> torch.Tensor:
    """Angle between a and b (over `dim`, or as whole tensors), accurate for tiny angles.

    arccos of the cosine loses everything below ~3e-4 rad in float32 (cos = 1 - theta^2/2).
    Kahan's form 2 atan2(|u - v|, |u + v|) on the unit vectors u, v has an absolute error of a few
    ulps at any angle, and gives exactly 0 when b == a."""
    dtype = torch.promote_types(a.dtype, torch.float32)
    a, b = a.to(dtype), b.to(dtype)
    if dim is None:
        a, b, dim = a.flatten(), b.flatten(), 0
    u = a / torch.linalg.vector_norm(a, dim=dim, keepdim=True)
    v = b / torch.linalg.vector_norm(b, dim=dim, keepdim=True)
    return 2 * torch.atan2(torch.linalg.vector_norm(u - v, dim=dim), torch.linalg.vector_norm(u + v, dim=dim))


def weight_matrices(model: nn.Module) -> Iterator[Tuple[str, int, str, str, nn.Parameter]]:
    """(stack, layer, sublayer, param, weight) for every parameter with two or more dimensions.
    A model may say it itself (`model.weight_matrices()`); otherwise each matrix inside a
    residual sublayer is named after it, and any other one goes to stack "model"."""
    if hasattr(model, "weight_matrices"):
        yield from model.weight_matrices()
        return
    seen = set()
    for stack, layer, sublayer, res in getattr(model, "residuals", lambda: iter(()))():
        for name, p in res.named_parameters():
            if p.dim() >= 2:
                seen.add(id(p))
                yield stack, layer, sublayer, name, p
    for name, p in model.named_parameters():
        if p.dim() >= 2 and id(p) not in seen:
            yield "model", 0, name.rsplit(".", 1)[0], name, p


class WeightProbe:
    """Keeps one copy of the weight matrices (their values before the step being probed) and
    measures norms and angles on device; the caller syncs once for all of them.

    Under FSDP2 (`reduce`: the sum over ranks) a rank holds row shards: every quantity is then
    a sum over the local rows added across the ranks, in two collectives (the norms first, as
    the angle's unit vectors need them); FSDP shards dim 0, so each row, and its angle, is whole
    on one rank."""

    def __init__(self, model: nn.Module, reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        entries = list(weight_matrices(model))
        self.keys: List[Key] = [e[:4] for e in entries]
        self.weights = [e[4] for e in entries]
        self.reduce = reduce
        self.previous = [local(w).detach().clone() for w in self.weights]

    def snapshot(self) -> None:
        """Call before the optimiser step whose angular update is wanted."""
        with torch.no_grad():
            torch._foreach_copy_(self.previous, [local(w).detach() for w in self.weights])

    def _grads(self) -> List[torch.Tensor]:
        return [local(w.grad) if w.grad is not None else torch.zeros_like(p)
                for w, p in zip(self.weights, self.previous)]

    @torch.no_grad()
    def measure(self) -> torch.Tensor:
        """(5, n): ||w||, the angle from the snapshot, the mean angle of the rows, ||grad|| (0
        without a gradient), and the cosine between the snapshot (the weight the gradient was
        taken at) and the gradient (NaN without one)."""
        if self.reduce is not None:
            return self._measure_shards()
        norms = torch.stack(torch._foreach_norm([w.detach() for w in self.weights])).float()
        angles = torch.stack([angle(p, w) for p, w in zip(self.previous, self.weights)])
        rows = torch.stack([angle(p.flatten(1), w.flatten(1), dim=1).mean()
                            for p, w in zip(self.previous, self.weights)])
        grads = self._grads()
        grad_norms = torch.stack(torch._foreach_norm(grads)).float()
        dots = torch.stack([(p.float() * g.float()).sum() for p, g in zip(self.previous, grads)])
        previous_norms = torch.stack(torch._foreach_norm(self.previous)).float()
        return torch.stack([norms, angles.float(), rows.float(), grad_norms,
                            cosine(dots, previous_norms, grad_norms)])

    def _measure_shards(self) -> torch.Tensor:
        current = [local(w).detach().float() for w in self.weights]
        previous = [p.float() for p in self.previous]
        square = lambda ts: torch.stack(torch._foreach_norm(ts)) ** 2
        row_sums = torch.stack([angle(p.flatten(1), w.flatten(1), dim=1).sum() if w.numel() else w.new_zeros(())
                                for p, w in zip(previous, current)])
        grads = [g.float() for g in self._grads()]
        sums = self.reduce(torch.stack([square(current), square(previous), square(grads), row_sums]))
        # A collective of its own: the one above keeps its size, and so its sums' order over the ranks.
        dots = self.reduce(torch.stack([(p * g).sum() for p, g in zip(previous, grads)]))
        norms, previous_norms = sums[0].sqrt(), sums[1].sqrt()
        # angle()'s Kahan form on the whole tensors, its two norms summed over the shards.
        u = torch._foreach_div(previous, list(previous_norms.unbind()))
        v = torch._foreach_div(current, list(norms.unbind()))
        sides = self.reduce(torch.stack([square(torch._foreach_sub(u, v)), square(torch._foreach_add(u, v))]))
        angles = 2 * torch.atan2(sides[0].sqrt(), sides[1].sqrt())
        rows = sums[3] / torch.tensor([w.shape[0] for w in self.weights], device=sums.device)
        return torch.stack([norms, angles, rows, sums[2].sqrt(), cosine(dots, previous_norms, sums[2].sqrt())])


def cosine(dots: torch.Tensor, a_norms: torch.Tensor, b_norms: torch.Tensor) -> torch.Tensor:
    """<a, b> / (||a|| ||b||), NaN where either is 0 (no gradient: no direction to compare)."""
    norms = a_norms * b_norms
    return torch.where(norms > 0, dots / norms.clamp_min(torch.finfo(norms.dtype).tiny), float("nan"))


INVARIANCE_RTOL = 1e-4  # an output "unchanged" by a scaling: within this share of its largest |value|


def unchanged(output: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether `output` is `base` to within INVARIANCE_RTOL of base's largest |value|."""
    tol = INVARIANCE_RTOL * base.detach().abs().max().clamp_min(1e-12)
    return bool(((output.detach() - base.detach()).abs().max() <= tol).item())


@torch.no_grad()
def scale_invariance(model: nn.Module, forward: Callable[[], torch.Tensor], factor: float = 2.0) -> List[bool]:
    """For each weight matrix (WeightProbe order): is the output unchanged when the weight alone
    is multiplied by `factor`? Multiplying and dividing by 2 is exact in floating point, so the
    model is restored bit for bit. Costs one forward pass per matrix: run once, at init."""
    with eval_mode(model):
        base = forward()
        flags = []
        for *_, w in weight_matrices(model):
            w.mul_(factor)
            flags.append(unchanged(forward(), base))
            w.div_(factor)
    return flags


def grad_scaling_error(model: nn.Module, forward: Callable[[], torch.Tensor], invariant: List[bool],
                       factor: float = 2.0) -> Optional[float]:
    """Wan et al. 2021, Property 2, on the weights flagged scale-invariant (`invariant`,
    WeightProbe order): the largest over them of ||k grad L(kw) - grad L(w)|| / ||grad L(w)||,
    with k = `factor` and L a fixed random projection of the output (any function of an output
    that scaling w leaves unchanged has the property). The flagged weights are scaled at once,
    in two backward passes; where that changes the output (weights that pass scale_invariance's
    test only at this point, as those feeding a zero-initialised branch do), one at a time.
    Through autograd.grad: no .grad touched, no draw from the run's random streams, the weights
    restored bit for bit (x 2, / 2). None without a flagged weight."""
    weights = [w for (*_, w), inv in zip(weight_matrices(model), invariant) if inv]
    if not weights:
        return None
    with eval_mode(model):
        out = forward()
        generator = torch.Generator(device="cpu").manual_seed(0)
        direction = torch.randn(out.shape, generator=generator, dtype=torch.float32).to(out.device, out.dtype)
        at_w = torch.autograd.grad((out * direction).sum(), weights)

        def scaled(chosen: List[torch.Tensor]):
            """Whether the output stays with `chosen` scaled by k, and their gradients there."""
            with torch.no_grad():
                torch._foreach_mul_(chosen, factor)
            try:
                moved = forward()
                return unchanged(moved, out), torch.autograd.grad(
                    (moved * direction).sum(), chosen)
            finally:
                with torch.no_grad():
                    torch._foreach_div_(chosen, factor)

        together, at_kw = scaled(weights)
        if not together:
            at_kw = [scaled([w])[1][0] for w in weights]
    errors = [torch.linalg.vector_norm(factor * b - a) / torch.linalg.vector_norm(a).clamp_min(1e-30)
              for a, b in zip(at_w, at_kw)]
    return float(torch.stack(errors).max())


class Weights(Probe):
    """probe.weights: a layers row per weight matrix at every probe step (its norm, the angular
    update of the step, the effective lr, whether it is scale-invariant), and at init the
    equilibrium norms theory.py predicts, into the summary beside the other equilibria, and
    Property 2's error (grad_scaling_error) where some weight is scale-invariant."""

    name = flag = "weights"
    needs = (PROBE_BATCH,)
    combine = SUM_OF_SQUARES  # norms, angles and row sums from the local shards (WeightProbe)
    layers_columns = ("param", "grad_norm", "weight_norm", "angular_update", "row_angular_update",
                      "effective_lr", "scale_invariant", "elements", "grad_cosine")

    @classmethod
    def enabled(cls, cfg) -> bool:
        return bool(cfg.probe.enabled and cfg.probe.weights)  # its rows go with the sublayers'

    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        # Muon, RAdam and a plug-in optimiser have none; torch_form gives the name alone here.
        o = cfg.optim
        refuse_unless(cls, cfg, theory.torch_form(o.name, 0.0, 1.0)[0] in theory.OPTIMISERS,
                      f"its effective lr is derived for sgd, sgdm, adam and adamw, not optim.name={o.name}")

    def __init__(self, ctx: ProbeContext):
        super().__init__(ctx)
        self.probe = WeightProbe(ctx.model, reduce=ctx.reduce_sum if ctx.sharded else None)
        self.scale_invariant: List[bool] = []
        self.moved = False

    def at_init(self) -> None:
        ctx = self.ctx
        output = lambda: ctx.adapter.output(ctx.probe_batch)
        self.scale_invariant = scale_invariance(ctx.model, output)
        self._equilibrium_norms(ctx.summary)
        # Under FSDP2 the parameters are shards, whose gradients autograd.grad would not gather.
        ctx.summary["grad_scaling_error"] = (None if ctx.sharded else
                                             grad_scaling_error(ctx.model, output, self.scale_invariant))

    def _equilibrium_norms(self, summary: Dict) -> None:
        if "theory" not in summary:
            return
        o, t = self.ctx.cfg.optim, self.ctx.cfg.train
        # Defined by the hyper-parameters alone only for AdamW (SGD's needs the gradients).
        name, weight_decay = theory.torch_form(o.name, o.weight_decay, t.lr)
        norms = {".".join(map(str, key)): theory.equilibrium_norm(name, t.lr, weight_decay, o.momentum,
                                                                  elements=w.numel())
                 for key, w in zip(self.probe.keys, self.probe.weights)}
        summary["theory"]["equilibrium_norm"] = norms if any(norms.values()) else None

    def before_step(self, step: int) -> None:
        self.probe.snapshot()
        self.moved = True

    def measure(self, step: int) -> Rows:
        """One layers row per weight matrix; the step's own columns are empty where the weights
        did not move in it (step 0)."""
        norms, angles, row_angles, grads, cosines = self.probe.measure().tolist()  # one host sync
        moved, self.moved = self.moved, False
        lr, nan = self.ctx.lr(), float("nan")
        return Rows(layers=[
            {"step": step, "stack": stack, "layer": layer, "sublayer": sublayer, "param": param,
             "grad_norm": g if moved else nan, "weight_norm": n,
             "angular_update": a if moved else nan, "row_angular_update": r if moved else nan,
             "effective_lr": theory.effective_lr(self.ctx.optimiser, lr, n), "scale_invariant": inv,
             "elements": w.numel(), "grad_cosine": c if moved else nan}
            for (stack, layer, sublayer, param), w, n, a, r, g, inv, c
            in zip(self.probe.keys, self.probe.weights, norms, angles, row_angles, grads, self.scale_invariant,
                   cosines)])

    def state_dict(self) -> Dict:
        # The snapshot lives from before_step to measure within one step, never across a
        # checkpoint; checkpoints of earlier versions hold it as weights_previous (unread).
        return {"scale_invariant": self.scale_invariant}

    def load_state_dict(self, state: Dict) -> None:
        self.scale_invariant = state["scale_invariant"]
