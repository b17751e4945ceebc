"""Probes on a model at initialisation, without training: reusable by any run or preset.

- output_change: Admin's Theorem 2 protocol (Liu et al. 2020, arXiv 2004.08249, Sec. 3;
  LiyuanLucasLiu/Transformer-Clinic's `--plot_stability`); docs/methods.md, "Probes".
- grad_at_init: one backward pass at theta_0, per-sublayer gradient norms and the FFN output
  projection W_2's (Xiong et al. 2020, arXiv 2002.04745, Sec. 3: the last W_2 gradient is
  depth-independent for Post-LN and shrinks like 1/sqrt(L) for Pre-LN), and the gradient of
  each sublayer's output (Admin's Theorem 1 and Transformer-Clinic's `--plot_gradient`, which
  hooks the sublayer outputs, after the LN in Post-LN: the Post-LN decoder's vanish).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from stabexp.distributed import local, local_part, regather_root
from stabexp.model.transformer import Seq2SeqTransformer
from stabexp.probes.statistics import token_mean
from stabexp.errors import need
from stabexp.modes import eval_mode
from stabexp.probes import LayerProbe, hooked
from stabexp.probes.base import PROBE_BATCH, STABEXP_MODEL, SUBLAYERS, SUM_OF_SQUARES, TASK, Probe, Rows, refuse_unless

PERTURBATION = 1e-4  # Admin / Clinic: delta = 1e-4 * sign(N(0, 1))


def perturbed_parameters(model: Seq2SeqTransformer) -> List[nn.Parameter]:
    """Every weight matrix and the embeddings; not biases, norm gains, Admin's omegas or the
    scalars of ReZero, Fixup, NormFormer and DLCL (all of them vectors or scalars)."""
    from stabexp.model.transformer import DenseHistory

    skip = {id(m.weight) for m in model.modules() if isinstance(m, DenseHistory)}
    return [p for p in model.parameters() if p.dim() >= 2 and id(p) not in skip]


def _per_token_sq_change(a: torch.Tensor, b: torch.Tensor, tokens: Optional[torch.Tensor]) -> torch.Tensor:
    # Mean over (real) tokens of the squared L2 change: independent of the batch size, like model_update.
    return token_mean((a - b).pow(2).sum(-1), tokens)


@torch.no_grad()
def output_change(model: Seq2SeqTransformer, src: torch.Tensor, tgt_in: torch.Tensor,
                  scale: float = PERTURBATION, generator: Optional[torch.Generator] = None) -> Dict:
    """|F(x, W) - F(x, W + delta)|^2 with delta = scale * sign(N(0, 1)) on every perturbed weight,
    F the top decoder output, as the mean over target tokens of the squared L2 change; plus, per
    residual sublayer in `model.residuals()` order, the same change of the sublayer's input
    normalised by its per-token standard deviation (Clinic's x / x.std(-1)). The weights are
    restored exactly afterwards. Padded positions (a task with pad_id) are left out."""
    inputs: List[torch.Tensor] = []
    masks = model.token_masks(src, tgt_in)
    stacks = [stack for stack, *_ in model.residuals()]

    def keep(module, args):
        x = args[0]
        inputs.append(x / x.std(dim=-1, keepdim=True))

    # Under FSDP2 each rank perturbs its rows of each delta, drawn whole (the same on every rank).
    params = perturbed_parameters(model)
    mine = [local(p.detach()) for p in params]
    originals = [p.clone() for p in mine]
    try:
        with eval_mode(model), hooked((res, "pre", keep) for *_, res in model.residuals()):
            clean = model.features(src, tgt_in)
            clean_inputs, inputs[:] = list(inputs), []
            deltas = [local_part(scale * torch.randn(p.shape, generator=generator).sign(), p).to(m)
                      for p, m in zip(params, mine)]
            torch._foreach_add_(mine, deltas)
            noisy = model.features(src, tgt_in)
    finally:
        torch._foreach_copy_(mine, originals)
    per_sublayer = torch.stack([_per_token_sq_change(a, b, masks[stack])
                                for a, b, stack in zip(inputs, clean_inputs, stacks)])
    values = torch.cat([_per_token_sq_change(noisy, clean, model.feature_mask(src, tgt_in))[None],
                        per_sublayer]).tolist()
    return {"output_change": values[0], "input_change": values[1:]}


def grad_at_init(model: Seq2SeqTransformer, batch, loss: Optional[Callable] = None,
                 reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> Dict:
    """One forward/backward pass on `batch` without an optimiser step: total gradient norm,
    per-sublayer gradient norms and, for FFN sublayers, the norm of W_2's gradient (None
    elsewhere). `loss(logits, tgt_out)` is the task's training loss (default: cross-entropy).
    Gradients are cleared afterwards. `output_grad_norm`: per sublayer, the Frobenius norm over
    the batch of the loss's gradient with respect to the sublayer's output (what it passes up
    the stream: after the LN in Post-LN), as Clinic's `--plot_gradient` prints it. Under FSDP2
    (`reduce`: the sum over ranks) the gradient norms come from the local shards."""
    src, tgt_in, tgt_out = batch
    loss = loss or (lambda logits, target: F.cross_entropy(logits.flatten(0, 1), target.flatten()))
    residuals = list(model.residuals())
    n = len(residuals)
    output_grads: List[Optional[torch.Tensor]] = [None] * n

    def watch(i: int):
        def hook(module, args, output):
            def keep(grad):
                output_grads[i] = torch.linalg.vector_norm(grad)
            output.register_hook(keep)
        return hook

    model.zero_grad(set_to_none=True)
    with hooked((res, "post", watch(i)) for i, (*_, res) in enumerate(residuals)):
        loss(model(src, tgt_in), tgt_out).backward()
    total, per_sublayer = LayerProbe(model, reduce=reduce).grad_norms()
    ffn = [i for i, (_, _, name, _) in enumerate(residuals) if name == "ffn"]
    w2 = torch.stack(torch._foreach_norm([local(residuals[i][3].branch.fc2.weight.grad) for i in ffn]))
    if reduce is not None:
        w2 = reduce(w2 ** 2).sqrt()
    # A sublayer whose output the loss never reaches has a zero gradient, not a missing one.
    outputs = torch.stack([g if g is not None else total.new_zeros(()) for g in output_grads])
    values = torch.cat([total[None], per_sublayer, w2, outputs]).tolist()  # one host sync
    model.zero_grad(set_to_none=True)
    regather_root(model)
    w2_by_index = dict(zip(ffn, values[1 + n:1 + n + len(ffn)]))
    return {"grad_norm": values[0], "sublayer_grad_norm": values[1:1 + n],
            "w2_grad_norm": [w2_by_index.get(i) for i in range(n)],
            "output_grad_norm": values[1 + n + len(ffn):]}


def mean_of(results: List[Dict]) -> Dict:
    """The element-wise mean of several results of one probe (numbers, or lists of numbers with
    None where a sublayer has no value)."""
    def mean(values):
        if isinstance(values[0], list):
            return [mean(list(column)) for column in zip(*values)]
        return None if values[0] is None else sum(values) / len(values)
    return {key: mean([r[key] for r in results]) for key in results[0]}


class AtInit(Probe):
    """probe.at_init: Admin's output change on the probe batch (the mean over
    probe.perturbation_draws draws of delta) and the gradient at theta_0 (the mean over
    probe.grad_batches batches of the task's init stream, so that the training batches stay
    those of a run without this probe), in the step-0 rows. The gradient's forward runs in
    training mode, so with dropout it draws from torch's global generator: the draws happen on
    a fork of it, and the training run's own dropout masks stay those of a run without it."""

    name = flag = "at_init"
    needs = (SUBLAYERS, PROBE_BATCH, TASK, STABEXP_MODEL)
    # Under FSDP2 its passes run layer by layer on every rank; the gradient norms are sums of
    # squares over the local shards, the perturbation each rank's rows of the whole delta.
    combine = SUM_OF_SQUARES
    metrics_columns = ("grad_norm", "output_change")
    layers_columns = ("grad_norm", "input_change", "w2_grad_norm", "output_grad_norm")

    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        refuse_unless(cls, cfg, cfg.probe.enabled, "needs probe.enabled=true")
        refuse_unless(cls, cfg, cfg.model.arch != "normmlp", "measures residual sublayers, and model=normmlp has none")
        p = cfg.probe
        need(p.perturbation_draws >= 1, "probe.perturbation_draws", p.perturbation_draws, "must be an integer >= 1")
        need(p.grad_batches >= 0, "probe.grad_batches", p.grad_batches, "must be >= 0 (0: no gradient at init)")

    def at_init(self) -> Rows:
        ctx = self.ctx
        with torch.random.fork_rng(devices=[ctx.device] if ctx.device.type == "cuda" else []):
            values = self._measure()
        return Rows(metrics={"grad_norm": values["grad_norm"], "output_change": values["output_change"]},
                    sublayers=[{"grad_norm": g, "input_change": c, "w2_grad_norm": w2, "output_grad_norm": out}
                               for g, c, w2, out in zip(values["sublayer_grad_norm"], values["input_change"],
                                                        values["w2_grad_norm"], values["output_grad_norm"])])

    def _measure(self) -> Dict:
        ctx, p = self.ctx, self.ctx.cfg.probe
        generator = torch.Generator().manual_seed(ctx.cfg.seed)
        change = mean_of([output_change(ctx.model, *ctx.probe_batch, generator=generator)
                          for _ in range(p.perturbation_draws)])
        if p.grad_batches == 0:
            n = len(change["input_change"])
            return {**change, "grad_norm": None, "sublayer_grad_norm": [None] * n, "w2_grad_norm": [None] * n,
                    "output_grad_norm": [None] * n}
        reduce = ctx.reduce_sum if ctx.sharded else None
        grads = mean_of([grad_at_init(ctx.model, ctx.task.init_batch(), ctx.task.loss, reduce)
                         for _ in range(p.grad_batches)])
        return {**change, **grads}
