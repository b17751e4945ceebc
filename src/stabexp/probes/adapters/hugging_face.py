"""What the Hugging Face transformers adapters share: the batch as the model's inputs, the masks
of its real tokens, the probe pass, and each attention's largest logit observed in the
attention function the model calls (`stabexp.probes.observed_attention`)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from stabexp.modes import eval_mode
from stabexp.probes.adapters.base import Adapter, Hook, logits_of
from stabexp.probes.observed_attention import ObservedAttention


class HFAdapter(Adapter):
    """What the Hugging Face adapters share: the batch is a dict of the model's inputs (or the
    input ids), each stack's real tokens are the batch's mask of it (`MASKS`), the probe pass is
    the model's forward in eval mode with its hidden states, and each attention's largest logit
    is observed in the attention function the model calls (`observed_attention`): the probe
    pass runs the model's own eager attention, through which the logits pass."""

    MASKS: Dict[str, str] = {"decoder": "attention_mask"}  # stack -> the batch's key of its real tokens

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.observed = ObservedAttention(model)

    def attention_hook(self, attention: nn.Module) -> Optional[Hook]:
        """The hook that reads `attention`'s largest logit; None where the model's attention cannot
        be observed (the column is empty: `unobserved_attention`)."""
        return None if self.observed.why_not is not None else (attention, "post", self.observed.largest(attention))

    def unobserved_attention(self) -> Optional[str]:
        """Why some attention logits are empty, in one phrase; None while every attention is observed."""
        if self.observed.why_not is not None:
            return self.observed.why_not
        self.observed.settle()
        return "; ".join(f"{name}: {why}" for name, why in self.observed.unobserved.items()) or None

    def inputs(self, batch) -> Dict[str, Any]:
        return batch if isinstance(batch, dict) else {"input_ids": batch}

    def features(self, output) -> torch.Tensor:
        """F(x, theta) from the model's output."""
        return output.hidden_states[-1]

    def probe_pass(self, batch):
        inputs = self.inputs(batch)
        with eval_mode(self.model), self.observed.observing():
            output = self.model(**inputs, output_hidden_states=True)
        return self.features(output), logits_of(output)

    def token_masks(self, batch):
        batch = batch if isinstance(batch, dict) else {}
        return {stack: batch[key].bool() if batch.get(key) is not None else None for stack, key in self.MASKS.items()}

    def feature_mask(self, batch):
        return self.token_masks(batch)[list(self.MASKS)[-1]]


class HFEncoderDecoder(HFAdapter):
    """An encoder-decoder's: its stacks' blocks (`encoder.BLOCKS`, `decoder.BLOCKS`), each
    stack's mask, F(x, theta) the decoder's last hidden state."""

    BLOCKS = "layers"  # the attribute of each stack that lists its blocks
    MASKS = {"encoder": "attention_mask", "decoder": "decoder_attention_mask"}

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.stacks = list(zip(("encoder", "decoder"), self.blocks_of(model)))

    @classmethod
    def blocks_of(cls, model: nn.Module) -> Tuple[List[nn.Module], List[nn.Module]]:
        """(the encoder's blocks, the decoder's), empty where the model has no such stack."""
        base = getattr(model, "base_model", model)
        return tuple(list(getattr(getattr(base, stack, None), cls.BLOCKS, None) or []) for stack in ("encoder", "decoder"))

    def features(self, output) -> torch.Tensor:
        return output.decoder_hidden_states[-1]
