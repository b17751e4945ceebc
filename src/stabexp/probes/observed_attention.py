"""The largest attention logit of a Hugging Face model, read from the attention the model runs.

Every Hugging Face transformers family that dispatches its attention through transformers'
attention interface (`AttentionInterface`, https://huggingface.co/docs/transformers/attention_interface)
hands its attention function the query and key after every option it applies: the rotary
embedding, whole or partial, q / k norms, grouped- or multi-query key heads, and it passes the
scaling, any softcap, T5's relative position bias and a mask that holds the causal pattern,
the sliding window and the padding. During the probe pass the model's implementation is
switched to `OBSERVED`, a function registered with that interface (and with transformers' mask
interface as its eager mask, so that the mask is always materialised, 0 where a pair is kept):
it runs the model's own eager attention (`eager_attention_forward` of the model's modeling
file) for the output, so F(x, theta) is the model's eager computation, and from the same
arguments records the logits the softmax sees, q.k times the scaling, softcapped, plus the bias
and the mask's finite values, over the pairs the mask keeps.

Nothing is recomputed from the model's weights. The record is checked against the model's own
attention weights (the eager function returns them): where softmax of the recorded logits
differs from them, the model applies something to its scores that the call's arguments do not
say (an attention sink, a bias folded in elsewhere), and the logit is NaN (an empty cell), with
the reason kept in `ObservedAttention.unobserved`. So is an attention that does not go through
the interface (DeBERTa-v2, Bloom, MPT) records nothing, and GPT-2 with reorder_and_upcast_attn, whose
fp32-upcast attention the interface would replace by plain eager, is not observed
(`why_not_observable`). Falcon's ALiBi is folded into the mask it passes, and is in the number.

The record costs the probe pass an eager attention's scores and a few copies of them per batch
element at a time (B h T S elements each, one element of the batch after another): at a long
probe sequence, a short or small probe batch keeps it in memory.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn

OBSERVED = "stabexp_observed"  # the name the observing function is registered under

# The observer of the probe pass under way, if any: the registered function is global to
# transformers, the record belongs to one model's pass.
_ACTIVE: ContextVar[Optional["ObservedAttention"]] = ContextVar("stabexp_observed_attention", default=None)

# softmax(recorded logits) against the model's own attention weights: above this, the record is
# not the model's attention (fp32: rounding is about 1e-7; half precision: about 1e-3).
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8}
HALF_TOLERANCE = 1e-2


def why_not_observable(model: nn.Module) -> Optional[str]:
    """None where `model`'s attention can be observed through the attention interface, else why
    not, in a phrase."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "transformers is not installed"
    can = getattr(model, "_can_set_attn_implementation", None)
    if can is not None and not can():
        return (f"{type(model).__name__} does not dispatch its attention through transformers' attention "
                "interface")
    if getattr(getattr(model, "config", None), "reorder_and_upcast_attn", False):
        return ("its config's reorder_and_upcast_attn runs GPT-2's own fp32-upcast attention, which the "
                "interface's would replace")
    return None


def _register() -> None:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if OBSERVED not in ALL_ATTENTION_FUNCTIONS:
        ALL_ATTENTION_FUNCTIONS.register(OBSERVED, _observed_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(OBSERVED, ALL_MASK_ATTENTION_FUNCTIONS["eager"])


def _own_eager(module: nn.Module) -> Optional[Callable]:
    """The eager attention function of the modeling file that defines `module`'s class."""
    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)


def _observed_attention(module, query, key, value, attention_mask, *args, **kwargs):
    eager = _own_eager(module)
    if eager is None:  # not a transformers model's attention: nothing to run it by
        raise TypeError(f"{type(module).__name__} has no eager_attention_forward in {type(module).__module__}, "
                        f"which the attention implementation {OBSERVED!r} runs")
    output, weights = eager(module, query, key, value, attention_mask, *args, **kwargs)
    observer = _ACTIVE.get()
    if observer is not None and not args:
        observer.record(module, query, key, attention_mask, weights, kwargs)
    elif observer is not None:
        observer.refuse(module, query, "its attention function is called with positional options")
    return output, weights


class ObservedAttention:
    """The largest attention logit of each attention module of one Hugging Face model, recorded
    while `observing()` is on (the probe pass) and read by `largest(module)`."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.why_not = why_not_observable(model)  # None: observable
        self.seen: Dict[nn.Module, torch.Tensor] = {}
        self.gaps: Dict[nn.Module, Tuple[torch.Tensor, float]] = {}  # the pass's checks, not read yet
        self.unobserved: Dict[str, str] = {}  # attention class -> why its logits are not recorded

    @contextmanager
    def observing(self):
        """The model's forward passes inside run their attention through `OBSERVED`."""
        if self.why_not is not None:
            yield
            return
        _register()
        configs = {id(c): c for c in (getattr(m, "config", None) for m in self.model.modules())
                   if c is not None and hasattr(c, "_attn_implementation_internal")}
        # Each config's own implementation, sub-configs included, restored as it was.
        saved = {}

        def walk(config):
            if id(config) in saved:
                return
            saved[id(config)] = (config, config._attn_implementation_internal)
            for key in getattr(config, "sub_configs", {}) or {}:
                sub = getattr(config, key, None)
                if sub is not None and hasattr(sub, "_attn_implementation_internal"):
                    walk(sub)
        for config in configs.values():
            walk(config)
        token = _ACTIVE.set(self)
        try:
            for config, _ in saved.values():
                config._attn_implementation_internal = OBSERVED
            yield
        finally:
            for config, implementation in saved.values():
                config._attn_implementation_internal = implementation
            _ACTIVE.reset(token)

    def record(self, module, query, key, attention_mask, weights, options) -> None:
        if options.get("s_aux") is not None:
            return self.refuse(module, query, "its softmax has an attention sink (s_aux) beside the keys")
        if weights is None:
            return self.refuse(module, query, "its eager attention returns no weights to check the record against")
        # One batch element at a time: a few copies of its scores, not of the whole batch's. No
        # value goes to the host here: the check against the weights is settled once per pass
        # (`settle`), not once per attention and batch element.
        largest, gaps = [], []
        for b in range(query.shape[0]):
            one = {**options, "position_bias": _row(options.get("position_bias"), b)}
            logits, kept = attention_logits_seen(query[b:b + 1], key[b:b + 1], _row(attention_mask, b), one)
            if weights[b:b + 1].shape != logits.shape:
                return self.refuse(module, query, f"its attention weights are shaped {tuple(weights.shape)}, "
                                                  f"its logits {tuple(logits.shape)} a batch element")
            gaps.append(_gap(logits, kept, weights[b:b + 1]))
            largest.append(logits.masked_fill(~kept, float("-inf")).amax())
        gap = torch.stack(gaps).amax()
        self.gaps[module] = (gap, TOLERANCE.get(weights.dtype, HALF_TOLERANCE))
        self.seen[module] = torch.where(gap <= self.gaps[module][1], torch.stack(largest).amax().float(),
                                        torch.full((), float("nan"), device=gap.device))

    def settle(self) -> None:
        """The checks of the pass's records against the model's weights, read in one transfer: an
        attention whose softmax of the record departs from its weights is named in `unobserved`
        (its cell is NaN already)."""
        if not self.gaps:
            return
        modules = list(self.gaps)
        values = torch.stack([self.gaps[m][0].float() for m in modules]).tolist()
        for module, gap in zip(modules, values):
            if not gap <= self.gaps[module][1]:
                self.unobserved.setdefault(type(module).__name__, (
                    f"softmax of q.k (scaled, softcapped, plus the bias and mask its attention is called with) "
                    f"differs from its attention weights by {gap:.1e}: the model applies something more to its "
                    "scores"))
        self.gaps = {}

    def refuse(self, module, like: torch.Tensor, why: str) -> None:
        self.unobserved.setdefault(type(module).__name__, why)
        self.seen[module] = torch.full((), float("nan"), device=like.device)

    def largest(self, module: nn.Module) -> Callable:
        """A forward hook's fn ("post" on `module`): the largest logit its last call recorded, NaN
        where it recorded none (its attention did not go through the interface)."""
        def read(*_):
            value = self.seen.pop(module, None)
            if value is None:
                self.unobserved.setdefault(type(module).__name__, "its attention does not go through transformers' "
                                                                  "attention interface")
                device = next(module.parameters(), torch.empty(0)).device
                return torch.full((), float("nan"), device=device)
            return value
        return read


def attention_logits_seen(query: torch.Tensor, key: torch.Tensor, attention_mask: Optional[torch.Tensor],
                          options: Dict) -> "tuple[torch.Tensor, torch.Tensor]":
    """(the logits an eager attention's softmax sees (B, h, T, S), the pairs it keeps (bool,
    broadcastable)) from an attention function's arguments: q.k times the scaling (the head
    size's 1 / sqrt(d_h) where the call gives none), the key heads repeated for grouped- and
    multi-query attention, softcapped (Gemma 2: c tanh(s / c)), plus the position bias (T5) and
    the mask's finite values; kept: where the mask is not its dtype's minimum (or True)."""
    if key.shape[1] != query.shape[1]:
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
    scaling = options.get("scaling")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    logits = torch.matmul(query, key.transpose(-1, -2)) * scaling
    softcap = options.get("softcap")
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    bias = options.get("position_bias")
    if bias is not None:
        logits = logits + bias
    kept = torch.ones((), dtype=torch.bool, device=logits.device)
    if attention_mask is not None:
        mask = attention_mask[..., :key.shape[-2]]
        if mask.dtype == torch.bool:
            kept = mask
        else:
            kept = mask > torch.finfo(mask.dtype).min / 2
            logits = logits + mask.masked_fill(~kept, 0)
    return logits, kept.expand_as(logits) if kept.dim() else kept.expand(logits.shape)


def _row(tensor: Optional[torch.Tensor], b: int) -> Optional[torch.Tensor]:
    """Batch element `b` of a tensor broadcast over the batch (a mask or bias of size 1 there)."""
    if tensor is None or tensor.dim() == 0:
        return tensor
    return tensor[b:b + 1] if tensor.shape[0] > 1 else tensor


def _gap(logits: torch.Tensor, kept: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """How far softmax(logits) over the kept pairs is from the model's own attention weights: the
    largest difference of a probability (0-d, on the device)."""
    rows = kept.any(-1, keepdim=True)  # a query with no key to look at (a padded row) is not compared
    probs = torch.softmax(logits.float().masked_fill(~kept, float("-inf")), dim=-1)
    return probs.sub_(weights).abs_().masked_fill_(~rows, 0).amax()
