"""Hugging Face transformers' BART and Marian encoder-decoders (the fairseq Transformer's Post-LN layout)."""

from __future__ import annotations

from typing import List, Tuple

import torch.nn as nn

from stabexp.probes.adapters.base import Sublayer, has
from stabexp.probes.adapters.hugging_face import HFEncoderDecoder


class HFSeq2SeqAdapter(HFEncoderDecoder):
    """A Hugging Face transformers encoder-decoder laid out as BART and Marian (the fairseq
    Transformer's Post-LN layout, the papers' kind of model; `model.encoder.layers[i]`:
    self_attn, self_attn_layer_norm, fc1, fc2, final_layer_norm, and in the decoder's layers
    encoder_attn and encoder_attn_layer_norm between). Post-LN: the stream entering a sublayer is
    the previous LayerNorm's output (the layer's input for the first), and each LayerNorm takes
    x + G(x). F(x, theta) is the decoder's last hidden state; the logits, the model's. The
    attention logits are the model's own, observed in its attention over the pairs its masks
    keep. The batch is a dict of the model's inputs (input_ids,
    attention_mask, decoder_input_ids, decoder_attention_mask)."""

    KINDS = ("bart", "marian")  # Post-LN; mBART's and Pegasus's layers, the same names in Pre-LN order, are not
    LAYOUT = ("self_attn.q_proj", "self_attn.k_proj", "self_attn_layer_norm", "fc1", "fc2", "final_layer_norm")

    @classmethod
    def knows(cls, model: nn.Module) -> bool:
        encoder, decoder = cls.blocks_of(model)
        return (getattr(model.config, "model_type", None) in cls.KINDS and bool(encoder) and bool(decoder)
                and all(has(layer, part) for layer in encoder + decoder for part in cls.LAYOUT))

    def sublayers(self) -> List[Sublayer]:
        found = []
        for stack, layers in self.stacks:
            for i, layer in enumerate(layers, start=1):
                attentions = [("self_attn", layer.self_attn, layer.self_attn_layer_norm)]
                if stack == "decoder":
                    attentions.append(("cross_attn", layer.encoder_attn, layer.encoder_attn_layer_norm))
                previous: Tuple[nn.Module, str] = (layer, "pre")
                for name, attn, norm in attentions:
                    found.append(Sublayer(stack, i, name, [*attn.parameters(), *norm.parameters()], previous, norm,
                                          self.attention_hook(attn)))
                    previous = (norm, "post")
                ffn = [*layer.fc1.parameters(), *layer.fc2.parameters(), *layer.final_layer_norm.parameters()]
                found.append(Sublayer(stack, i, "ffn", ffn, previous, layer.final_layer_norm))
        return found
