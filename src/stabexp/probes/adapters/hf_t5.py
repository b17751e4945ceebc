"""Hugging Face transformers' T5 and mT5 encoder-decoders."""

from __future__ import annotations

from typing import Any, Dict, List

import torch.nn as nn

from stabexp.probes.adapters.base import Sublayer, has
from stabexp.probes.adapters.hugging_face import HFEncoderDecoder


class HFT5Adapter(HFEncoderDecoder):
    """A Hugging Face transformers T5 encoder-decoder (T5ForConditionalGeneration, T5Model, and by
    the same code mT5 and T5 v1.1, whose FFN is gated: DenseReluDense.wi_0, wi_1). Each block of
    `encoder.block` and `decoder.block` holds its sub-layers in `layer`: layer[0] the
    self-attention (layer_norm, SelfAttention with q, k, v, o), in the decoder layer[1] the
    cross-attention (layer_norm, EncDecAttention), and last the FFN (layer_norm,
    DenseReluDense). Pre-LN: each sub-layer's T5LayerNorm (an RMS norm: no mean subtracted, no
    bias) takes the stream entering it, and each stack ends with its final_layer_norm. The
    relative position bias is the first block's self-attention's `relative_attention_bias`,
    whose values that block computes and passes on to the others of its stack: its weights count
    in the first block's self-attention sublayer. F(x, theta) is the decoder's last hidden state,
    after its final_layer_norm; the logits, the model's (T5ForConditionalGeneration scales the
    decoder's output by d_model^-1/2 before lm_head where its config's scale_decoder_outputs says
    so, as for classic T5: F is taken before that). The largest attention logit is the largest
    logit the softmax sees, q.k (which T5 does not divide by sqrt(d_h)) plus the relative position
    bias, observed in the model's attention over the pairs its masks keep. The batch is a dict of the
    model's inputs (input_ids, attention_mask, decoder_input_ids or labels,
    decoder_attention_mask)."""

    KINDS = ("t5", "mt5")  # UMT5 (a position bias in every block), LongT5 (local attention) are not
    BLOCKS = "block"

    def inputs(self, batch) -> Dict[str, Any]:
        if not isinstance(batch, dict):  # T5 makes no decoder inputs of the input ids, as BART does
            raise TypeError("a T5 probe batch is a dict of the model's inputs: input_ids and decoder_input_ids "
                            "(or labels), with their attention masks where padded")
        return batch

    @classmethod
    def knows(cls, model: nn.Module) -> bool:
        encoder, decoder = cls.blocks_of(model)

        def laid_out(block, decoder_block):
            parts = list(getattr(block, "layer", None) or [])
            if len(parts) != (3 if decoder_block else 2):
                return False
            attentions = [(parts[0], "SelfAttention")] + ([(parts[1], "EncDecAttention")] if decoder_block else [])
            return (all(has(part, f"{name}.{proj}") and has(part, "layer_norm")
                        for part, name in attentions for proj in ("q", "k"))
                    and has(parts[-1], "DenseReluDense") and has(parts[-1], "layer_norm"))
        return (getattr(model.config, "model_type", None) in cls.KINDS and bool(encoder) and bool(decoder)
                and all(laid_out(b, False) for b in encoder) and all(laid_out(b, True) for b in decoder))

    def sublayers(self) -> List[Sublayer]:
        found = []
        for stack, blocks in self.stacks:
            for i, block in enumerate(blocks, start=1):
                attentions = [("self_attn", block.layer[0], block.layer[0].SelfAttention)]
                if stack == "decoder":
                    attentions.append(("cross_attn", block.layer[1], block.layer[1].EncDecAttention))
                for name, part, attn in attentions:
                    found.append(Sublayer(stack, i, name, list(part.parameters()), (part.layer_norm, "pre"),
                                          part.layer_norm, self.attention_hook(attn)))
                ffn = block.layer[-1]
                found.append(Sublayer(stack, i, "ffn", list(ffn.parameters()), (ffn.layer_norm, "pre"), ffn.layer_norm))
        return found
