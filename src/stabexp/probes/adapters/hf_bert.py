"""Hugging Face transformers' BERT-style encoders (BERT, RoBERTa, DeBERTa-v2)."""

from __future__ import annotations

from typing import List

import torch.nn as nn

from stabexp.probes.adapters.base import Sublayer, has
from stabexp.probes.adapters.hugging_face import HFAdapter


class HFEncoderAdapter(HFAdapter):
    """A Hugging Face transformers encoder-only model laid out as BERT (BERT, RoBERTa, DeBERTa-v2
    and their heads; `encoder.layer[i]`: attention.self, attention.output (dense,
    LayerNorm), intermediate, output (dense, LayerNorm)). Post-LN: the stream entering the
    self-attention is the layer's input and the one entering the FFN the attention's LayerNorm
    output; each LayerNorm takes x + G(x). F(x, theta) is the last hidden state (the top layer's
    LayerNorm output); the logits, the head's. The attention logits are the model's own,
    observed in its attention over every pair of real tokens (the causal pairs of a BERT built as
    a decoder). The batch is a dict of the
    model's inputs (input_ids, attention_mask) or the input ids."""

    LAYOUT = ("attention.self", "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")
    MASKS = {"encoder": "attention_mask"}

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.layers = list(encoder_layers(model))

    def sublayers(self) -> List[Sublayer]:
        found = []
        for i, layer in enumerate(self.layers, start=1):
            attention, attention_norm = layer.attention, layer.attention.output.LayerNorm
            found.append(Sublayer("encoder", i, "self_attn", list(attention.parameters()), (layer, "pre"),
                                  attention_norm, self.attention_hook(attention.self)))
            found.append(Sublayer("encoder", i, "ffn", [*layer.intermediate.parameters(), *layer.output.parameters()],
                                  (attention_norm, "post"), layer.output.LayerNorm))
        return found

def encoder_layers(model: nn.Module) -> List[nn.Module]:
    """The layers of a BERT-style encoder (HFEncoderAdapter.LAYOUT in each), else []."""
    base = getattr(model, "base_model", model)
    layers = list(getattr(getattr(base, "encoder", None), "layer", None) or [])
    return layers if layers and all(has(layer, part) for layer in layers for part in HFEncoderAdapter.LAYOUT) else []
