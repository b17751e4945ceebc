"""What every adapter is: a model's residual sublayers (`Sublayer`) and its probe pass (`Adapter`),
and the helpers the adapters share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn


# A forward hook (module, "pre" | "post" | "pre_kwargs", fn): "pre" fn(module, args); "post"
# fn(module, args, output); "pre_kwargs" fn(module, args, kwargs), for a module whose inputs
# come by keyword. An attention hook's fn returns the sublayer's logits (B, h, T, S), or their
# largest value.
Hook = Tuple[nn.Module, str, Callable]


@dataclass
class Sublayer:
    """One residual sublayer of a model, as the probes see it."""

    stack: str                      # "encoder" or "decoder" (a single-stack model: its one stack)
    layer: int                      # 1-based, bottom-up in its stack
    name: str                       # "self_attn", "cross_attn" or "ffn"
    parameters: List[nn.Parameter]  # its own: the branch, its norms, the placement's scalars
    stream: Tuple[nn.Module, str]   # (module, "pre"): its first input is the residual stream x
                                    # entering the sublayer; (module, "post"): its output is
    norm: Optional[nn.Module] = None  # the norm on the stream (ln_input_norm: its input); None: none
    attention: Optional[Hook] = None  # the hook that gives its attention logits; None: an FFN


class Adapter:
    """What the probes know of one model. Subclasses give `sublayers` and `probe_pass`; the
    masks default to every position being a real token."""

    def __init__(self, model: nn.Module):
        self.model = model

    def sublayers(self) -> List[Sublayer]:
        raise NotImplementedError

    def probe_pass(self, batch) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(F(x, theta) (B, T, d), the logits (B, T, V) or None) on `batch`, the model in eval
        mode (no dropout) and every attention's logits within reach of its hook."""
        raise NotImplementedError

    def output(self, batch) -> torch.Tensor:
        """The model's output on `batch` (its logits), as its training loop calls it."""
        return logits_of(call(self.model, batch))

    def token_masks(self, batch) -> Dict[str, Optional[torch.Tensor]]:
        """Per stack, the real tokens of its input (B, T) bool; None: every position."""
        return {s.stack: None for s in self.sublayers()}

    def feature_mask(self, batch) -> Optional[torch.Tensor]:
        """The rows of F that are real tokens (B, T) bool; None: every row."""
        return None

def call(model: nn.Module, batch) -> Any:
    """A model called on a batch as it is usually called: keywords from a dict, arguments from a
    tuple or list, one tensor as it is."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def logits_of(output) -> Optional[torch.Tensor]:
    """The logits in a model's output: a Hugging Face output's `.logits`, a dict's "logits", a
    tensor, or the first tensor of a tuple."""
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, dict):
        return output.get("logits")
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None

def has(module: nn.Module, dotted: str) -> bool:
    for name in dotted.split("."):
        module = getattr(module, name, None)
        if module is None:
            return False
    return True
