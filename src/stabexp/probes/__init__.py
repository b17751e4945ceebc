"""Probes: what the studies measure, computed on device with one host sync per probe. This
module holds the measures; each probe that a run calls is a class of stabexp.probes.base's
`Probe` in its own module (the built-ins: probes/builtin.py; docs/probes.md).

- model_update: DeepNet (arXiv v1) Sec. 3 / Fig. 4, ||F(x, theta_i) - F(x, theta_0)||.
- per-sublayer gradient norms: DeepNet Fig. 4, the gradient per layer.
- ln_input_norm: DeepNet Fig. 4, the mean L2 norm of the input of each LayerNorm on the
  residual stream.
- The small-scale instability proxies of Wortsman et al. 2023 (arXiv 2309.14322): the largest
  attention logit per attention sublayer (Sec. 3.1.1, `max_attention_logit`), the mean and max
  of the output log Z (Sec. 3.1.2, `log_z_stats`) and each sublayer's update RMS relative to
  its weights' RMS (`LayerProbe.relative_updates`; the paper follows the update RMS per layer).

Probes observe the model one way only: PyTorch forward hooks on the submodules its adapter
names (probes/adapters/; for stabexp's models, those model/transformer.py names: the residual
sublayers, their stream norm `ln`, their branch, each attention's `scores` inside
`explicit_attention()`), attached for one pass and removed after it (`hooked`), so training
runs the model without any.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn as nn

from stabexp.distributed import local
from stabexp.probes.statistics import log_z, max_attention_logit, per_token_norm, token_mean  # noqa: F401


@contextmanager
def hooked(hooks: Iterable[Tuple[nn.Module, str, Callable]]):
    """Attach (module, "pre" | "post" | "pre_kwargs", fn) forward hooks for the block, remove them
    after it ("pre_kwargs": a pre-hook that also sees the keyword inputs, fn(module, args, kwargs))."""
    handles = []
    try:
        for module, when, fn in hooks:
            if when == "pre_kwargs":
                handles.append(module.register_forward_pre_hook(fn, with_kwargs=True))
            else:
                register = module.register_forward_pre_hook if when == "pre" else module.register_forward_hook
                handles.append(register(fn))
        yield
    finally:
        for h in handles:
            h.remove()


def model_update(features: torch.Tensor, features_init: torch.Tensor,
                 tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """||F(x, theta_i) - F(x, theta_0)|| for F of shape (B, T, d), normalised per token:
    sqrt(mean over the B*T target tokens of ||dF_token||_2^2) = ||dF||_F / sqrt(B T).
    The Frobenius norm of the whole batch would grow like sqrt(B T); this does not, so the
    value does not depend on the probe batch size (DeepNet does not state its normalisation).
    With `tokens` (B, T), the mean runs over the real (unpadded) target tokens only."""
    return per_token_norm(features - features_init, tokens)


class _Method(nn.Module):
    """A module's method as a forward, for torch.func.functional_call (`read_with`)."""

    def __init__(self, module: nn.Module, method: str):
        super().__init__()
        self.module, self.method = module, method

    def forward(self):
        return getattr(self.module, self.method)()


def read_with(module: nn.Module, method: str, parameters: Dict[str, torch.Tensor]):
    """module.<method>() (say a branch's `matrices()`) computed from `parameters` (name -> tensor)
    in place of the module's own: whole ones gathered from FSDP2 shards, or stand-ins that
    number rows. The module is left as it was."""
    return torch.func.functional_call(_Method(module, method), {f"module.{n}": t for n, t in parameters.items()}, ())


def reference_features(adapter, batch) -> torch.Tensor:
    """F(x, theta) on the probe batch as every probe step takes it (the adapter's probe pass,
    LayerProbe.measure_pass), so that the model update at step 0 is exactly 0: a copy, kept."""
    with torch.no_grad():  # the copy kept is an ordinary tensor, whatever mode the pass ran in
        features = adapter.probe_pass(batch)[0]
    return features.clone()


def log_z_stats(logits: torch.Tensor, tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(mean, max) over the (real) positions of log Z = logsumexp_j y_j, the output logits'
    normaliser (Wortsman et al. 2023, Sec. 3.1.2: output logit divergence). logits (B, T, V), or a
    classifier's (B, C) with tokens None."""
    values = log_z(logits)
    peak = values.amax() if tokens is None else values.masked_fill(~tokens, float("-inf")).amax()
    return torch.stack([token_mean(values, tokens), peak])


class LayerProbe:
    """Per-sublayer statistics of a model, in the order its adapter lists the residual
    sublayers (stabexp.probes.adapters; `model.residuals()` for stabexp's own).

    The parameters of a sublayer are its branch (attention or FFN), its norms and its
    placement's scalars (Admin's omega, Fixup's shift and scale); a parameter shared by the
    sublayers of a layer (ReZero's alpha) counts in the layer's last one. Norms come from one
    torch._foreach_norm over all gradients, summed per sublayer on device, so there is no
    Python work per parameter beyond building lists.

    A model sharded by FSDP2 (stabexp.distributed) holds each parameter and gradient as a
    DTensor shard: the squared norms are then taken of the local shards and summed across the
    ranks by `reduce`, one collective for all sublayers per call (the gradient norms; the
    relative updates).
    """

    def __init__(self, model, reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        from stabexp.probes.adapters import adapter_for

        self.adapter = adapter_for(model)  # a model, or the adapter of one
        self.model = self.adapter.model
        self.reduce = reduce
        self.sublayers = self.adapter.sublayers()
        self.keys: List[Tuple[str, int, str]] = [(s.stack, s.layer, s.name) for s in self.sublayers]
        sublayer_of = {id(p): i for i, s in enumerate(self.sublayers) for p in s.parameters}
        self.params = list(self.model.parameters())
        # Bucket of each parameter: its sublayer, or len(keys) for embeddings and final LNs.
        owner = [sublayer_of.get(id(p), len(self.keys)) for p in self.params]
        self.owner = torch.tensor(owner, dtype=torch.long, device=self.params[0].device)
        # The relative update runs over the sublayers' weight matrices: on a CPU the cost of a
        # _foreach op is per tensor, and biases, norms and scalars are two thirds of them.
        self.matrices = [(i, p) for p, i in zip(self.params, owner) if p.dim() >= 2 and i < len(self.keys)]
        self.matrix_owner = torch.tensor([i for i, _ in self.matrices], dtype=torch.long, device=self.owner.device)
        self.previous: Optional[List[torch.Tensor]] = None  # theta_{i-1}, taken by `snapshot`
        # Each parameter's squared gradient norm as backward left it (`watch_gradients`).
        self.captured: Optional[torch.Tensor] = None
        self.armed = self.caught = False

    def bucket_sums(self, tensors: List[torch.Tensor], owner: torch.Tensor, buckets: int) -> torch.Tensor:
        """Squared norms of `tensors`, from one _foreach_norm, summed per bucket (owner[k] is
        tensor k's bucket), and across the ranks' shards when sharded."""
        sq = torch.stack(torch._foreach_norm([local(t) for t in tensors])).float() ** 2
        sums = torch.zeros(buckets, device=sq.device).index_add_(0, owner.to(sq.device), sq)
        return self.reduce(sums) if self.reduce is not None else sums

    def snapshot(self) -> None:
        """Keep the weight matrices before an optimiser step, for `relative_updates` after it."""
        current = [local(p.detach()) for _, p in self.matrices]
        if self.previous is None:
            self.previous = [w.clone() for w in current]
        elif current:  # a model without residual sublayers (NormMLP) has nothing to keep
            torch._foreach_copy_(self.previous, current)

    @torch.no_grad()
    def relative_updates(self) -> torch.Tensor:
        """Per sublayer, RMS(W_i - W_{i-1}) / RMS(W_i) over its weight matrices (= ||update|| /
        ||W_i||, both RMS running over the same elements; Wortsman et al. 2023 follow the update
        RMS per layer). NaN without a snapshot; uses it up: the snapshot becomes the (negated)
        update in place and both norms come from one _foreach_norm."""
        n = len(self.keys)
        if self.previous is None or not self.matrices:
            return torch.full((n,), float("nan"), device=self.owner.device)
        current = [local(p.detach()) for _, p in self.matrices]
        torch._foreach_sub_(self.previous, current)
        # Update and weights in one call: buckets 0..n-1 the update's, n..2n-1 the weights'.
        owner = torch.cat([self.matrix_owner, self.matrix_owner + n])
        sums = self.bucket_sums(self.previous + current, owner, 2 * n)
        return (sums[:n] / sums[n:]).sqrt()

    def watch_gradients(self, loss_scale: Optional[Callable[[], float]] = None) -> None:
        """Read the gradients where the backward pass leaves them, before a training loop's
        clipping rescales them: while `armed`, a post-accumulate-grad hook on each parameter
        keeps its squared gradient norm (over accumulated micro-batches the last backward's,
        the sum of theirs), and `grad_norms` reads those. For loops whose clipping runs before
        any moment a callback is given (the Hugging Face Trainer's on_pre_optimizer_step comes
        after it); arm only the steps to probe, so that the others pay nothing. Under fp16 mixed
        precision the backward pass leaves the gradients times the loss scale: `loss_scale()`
        (a GradScaler's get_scale) is divided out when they are read."""
        self.loss_scale = loss_scale
        self.captured = torch.zeros(len(self.params), device=self.owner.device)
        self.watching = [p.register_post_accumulate_grad_hook(lambda param, k=k: self._capture(k, param))
                         for k, p in enumerate(self.params) if p.requires_grad]

    def unwatch_gradients(self) -> None:
        for handle in getattr(self, "watching", ()):
            handle.remove()
        self.captured, self.watching, self.armed, self.caught = None, [], False, False

    @torch.no_grad()
    def _capture(self, k: int, param: torch.Tensor) -> None:
        if self.armed:
            self.captured[k] = torch.linalg.vector_norm(local(param.grad)).float() ** 2
            self.caught = True

    def arm(self, on: bool) -> None:
        """Keep (True) or not the gradients of the backward passes to come; either way those
        kept before are forgotten."""
        if self.captured is not None:
            if on:
                self.captured.zero_()
            self.armed, self.caught = on, False

    def grad_norms(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(total gradient norm of the model, gradient norm per sublayer), from one
        torch._foreach_norm over all gradients, or those `watch_gradients` kept; NaN before
        any backward pass."""
        n = len(self.keys)
        if self.caught:
            sums = torch.zeros(n + 1, device=self.captured.device).index_add_(0, self.owner, self.captured)
            if self.loss_scale is not None:
                sums = sums / float(self.loss_scale()) ** 2
            sums = self.reduce(sums) if self.reduce is not None else sums
            return sums.sum().sqrt(), sums[:n].sqrt()
        if all(p.grad is None for p in self.params):
            nan = torch.full((), float("nan"), device=self.owner.device)
            return nan, torch.full((n,), float("nan"), device=self.owner.device)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        buckets = self.bucket_sums(grads, self.owner, n + 1)
        return buckets.sum().sqrt(), buckets[:n].sqrt()

    def features_with_ln_norms(self, src: torch.Tensor, tgt_in: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.probe_pass(src, tgt_in)[:2]

    def probe_pass(self, *batch) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(F, ln_input_norm, max_attn_logit, stream_norm) on stabexp's batch (src, tgt_in)."""
        return self.measure_pass(batch)[:4]

    # no_grad, not inference_mode: under FSDP the pass fills the layers' all-gather buffers,
    # which the training step writes again, and an inference tensor cannot be written outside it.
    @torch.no_grad()
    def measure_pass(self, batch):
        """F(x, theta) in eval mode (no dropout), plus, on the same pass, each sublayer's
        ln_input_norm (over the real tokens of its stack's input), its largest attention
        logit (NaN for an FFN) and its stream_norm, the mean norm per token of the residual
        stream x entering it, which every placement has; and the logits where the adapter's
        pass gives them (None: the model's `logits(F)`). stabexp's attention runs by hand here
        (`explicit_attention`), so F here and the fused kernel's F differ by rounding (about 1e-7)."""
        n = len(self.keys)
        tokens = self.adapter.token_masks(batch)
        # Each hook keeps its per-token norms, flat; their means over the real tokens are taken
        # after the pass, one reduction per stack (`_token_means`): per hook they cost more than
        # the norms themselves on a small model.
        ln_norms: List[Optional[torch.Tensor]] = [None] * n
        stream_norms: List[Optional[torch.Tensor]] = [None] * n
        max_logits: List[Optional[torch.Tensor]] = [None] * n
        handed = [None, None, None]  # the last sublayer whose stream a hook read, that stream, its norms

        def token_norms(into: List, i: int, real: Optional[torch.Tensor], stream: bool, output: bool = False):
            def hook(module, args, *out):
                x = out[0] if output else args[0]
                if not stream and handed[0] == i and x is handed[1]:
                    into[i] = handed[2]  # a Pre-LN norm reads the very stream its sublayer was handed
                    return
                norms = torch.linalg.vector_norm(x.detach(), dim=-1)
                if real is not None:
                    # A layer may hand on its tokens flattened (OPT's FFN takes (B*T, d)): back in
                    # the batch's (B, T) shape.
                    if norms.dim() == 1 and norms.numel() == real.numel():
                        norms = norms.view(real.shape)
                    if norms.shape != real.shape:
                        raise ValueError(f"{type(module).__name__}'s stream has its tokens as {tuple(norms.shape)} "
                                         f"and the adapter's token mask is {tuple(real.shape)}: an adapter with "
                                         "token masks needs batch-first streams (B, T, d)")
                into[i] = norms.reshape(-1)
                if stream:
                    handed[:] = i, x, into[i]
            return hook

        def largest_logit(i: int, logits: Callable):
            def hook(*args):
                max_logits[i] = logits(*args).amax()
            return hook

        hooks = [(s.stream[0], s.stream[1], token_norms(stream_norms, i, tokens.get(s.stack), True, s.stream[1] == "post"))
                 for i, s in enumerate(self.sublayers)]
        hooks += [(s.norm, "pre", token_norms(ln_norms, i, tokens.get(s.stack), False))
                  for i, s in enumerate(self.sublayers) if s.norm is not None]
        hooks += [(s.attention[0], s.attention[1], largest_logit(i, s.attention[2]))
                  for i, s in enumerate(self.sublayers) if s.attention is not None]
        with hooked(hooks):
            feats, logits = self.adapter.probe_pass(batch)
        handed[:] = None, None, None
        if not n:
            return feats, feats.new_zeros(0), feats.new_zeros(0), feats.new_zeros(0), logits
        # NaN (an empty cell) where a placement has no norm on the stream (ReZero, Fixup,
        # T-Fixup), and for the attention logit of an FFN.
        nan = feats.new_full((), float("nan"))
        return (feats, self._token_means(ln_norms, tokens, feats), torch.stack([v if v is not None else nan for v in max_logits]),
                self._token_means(stream_norms, tokens, feats), logits)

    def _token_means(self, norms: List[Optional[torch.Tensor]], tokens: Dict, like: torch.Tensor) -> torch.Tensor:
        """Per sublayer, the mean of its kept per-token norms over its stack's real tokens (NaN
        where it kept none), from one reduction per stack."""
        means = like.new_full((len(norms),), float("nan"), dtype=torch.float32)
        for stack in dict.fromkeys(s.stack for s in self.sublayers):
            kept = [i for i, s in enumerate(self.sublayers) if s.stack == stack and norms[i] is not None]
            if kept:
                real = tokens.get(stack)  # None (a stack the masks leave out): every position
                values = torch.stack([norms[i] for i in kept]).float()
                means[kept] = token_mean(values, None if real is None else real.reshape(-1), dims=1)
        return means
