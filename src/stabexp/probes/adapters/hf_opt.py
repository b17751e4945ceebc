"""Hugging Face transformers' OPT, Pre-LN or Post-LN."""

from __future__ import annotations

from typing import List

import torch.nn as nn

from stabexp.probes.adapters.base import Sublayer, has
from stabexp.probes.adapters.hugging_face import HFAdapter


class HFOPTAdapter(HFAdapter):
    """A Hugging Face transformers OPT decoder (OPTForCausalLM, OPTModel; `model.decoder.layers[i]`:
    self_attn (q_proj, k_proj, v_proj, out_proj), self_attn_layer_norm, fc1, fc2,
    final_layer_norm), in either placement its config's `do_layer_norm_before` says. True (the
    Pre-LN placement of most OPT sizes): each LayerNorm takes the stream entering its sublayer,
    and the decoder ends with its own final_layer_norm (unless its config's
    _remove_final_layer_norm says otherwise). False (the Post-LN placement OPT-350m is
    built with): each LayerNorm takes x + G(x), the stream entering the self-attention is the
    layer's input and the one entering the FFN the self-attention's LayerNorm output, and the
    decoder has no final norm. F(x, theta) is the last hidden state the model returns, the
    lm_head's input: after the decoder's final_layer_norm (Pre-LN) and after `project_out` where
    the model has one (word_embed_proj_dim != hidden_size, as OPT-350m: F is then
    word_embed_proj_dim wide, the projection of the top layer's output); the logits, the
    model's. The attention logits are the model's own, observed in its attention over the
    causal pairs whose key is a real token. The batch is a dict of the model's
    inputs (input_ids, attention_mask) or the input ids."""

    LAYOUT = ("self_attn.q_proj", "self_attn.k_proj", "self_attn_layer_norm", "fc1", "fc2", "final_layer_norm")

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self.layers = opt_layers(model)
        self.pre_ln = bool(getattr(model.config, "do_layer_norm_before", True))

    @classmethod
    def knows(cls, model: nn.Module) -> bool:
        return getattr(model.config, "model_type", None) == "opt" and bool(opt_layers(model))

    def sublayers(self) -> List[Sublayer]:
        found = []
        for i, layer in enumerate(self.layers, start=1):
            attn, attn_norm, ffn_norm = layer.self_attn, layer.self_attn_layer_norm, layer.final_layer_norm
            ffn = [*layer.fc1.parameters(), *layer.fc2.parameters(), *ffn_norm.parameters()]
            # Pre-LN: the stream entering a sublayer is its norm's input; Post-LN: the layer's
            # input, then the self-attention's LayerNorm output.
            streams = ([(attn_norm, "pre"), (ffn_norm, "pre")] if self.pre_ln
                       else [(layer, "pre"), (attn_norm, "post")])
            found.append(Sublayer("decoder", i, "self_attn", [*attn.parameters(), *attn_norm.parameters()], streams[0],
                                  attn_norm, self.attention_hook(attn)))
            found.append(Sublayer("decoder", i, "ffn", ffn, streams[1], ffn_norm))
        return found

def opt_layers(model: nn.Module) -> List[nn.Module]:
    """The layers of an OPT decoder (HFOPTAdapter.LAYOUT in each), else []."""
    base = getattr(model, "base_model", model)
    layers = list(getattr(getattr(base, "decoder", None), "layers", None) or [])
    return layers if layers and all(has(layer, part) for layer in layers for part in HFOPTAdapter.LAYOUT) else []
