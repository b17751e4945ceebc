"""A model built on torch.nn.Transformer, nn.TransformerEncoder or nn.TransformerDecoder."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, List, Tuple

import torch
import torch.nn as nn

from stabexp.model.transformer import attention_logits
from stabexp.modes import eval_mode
from stabexp.probes.adapters.base import Adapter, Sublayer, call, logits_of


@contextmanager
def _captured_output(module: nn.Module):
    """The output of `module` in the block's forward passes: the last call's, in box[0]."""
    box: List[torch.Tensor] = []

    def keep(module, args, output):
        box[:] = [output]
    handle = module.register_forward_hook(keep)
    try:
        yield box
    finally:
        handle.remove()

class TorchTransformerAdapter(Adapter):
    """A model built on torch.nn.Transformer, nn.TransformerEncoder or nn.TransformerDecoder
    (the first such module inside it): each layer's self-attention, cross-attention (decoder)
    and FFN sublayers, Post-LN or Pre-LN as the layer's `norm_first` says. F(x, theta) is that
    module's output; the logits, the model's own output. The probe pass turns off PyTorch's
    fused fast path, which would run the layers without calling their submodules."""

    def __init__(self, model: nn.Module, causal_decoder: bool = True):
        super().__init__(model)
        self.body = next(m for m in model.modules()
                         if isinstance(m, (nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder)))
        self.causal_decoder = causal_decoder  # the decoder's self-attention is causal (a tgt_mask)

    def _stacks(self):
        body = self.body
        if isinstance(body, nn.Transformer):
            return [("encoder", body.encoder.layers), ("decoder", body.decoder.layers)]
        if isinstance(body, nn.TransformerEncoder):
            return [("encoder", body.layers)]
        return [("decoder", body.layers)]

    def sublayers(self) -> List[Sublayer]:
        found = []
        for stack, layers in self._stacks():
            for i, layer in enumerate(layers, start=1):
                decoder = isinstance(layer, nn.TransformerDecoderLayer)
                attns = [("self_attn", layer.self_attn, layer.norm1, stack == "decoder" and self.causal_decoder)]
                if decoder:
                    attns.append(("cross_attn", layer.multihead_attn, layer.norm2, False))
                ffn_norm = layer.norm3 if decoder else layer.norm2
                # Post-LN: the stream entering a sublayer is the previous norm's output (the
                # layer's input for the first), and its norm takes x + G(x); Pre-LN: the norm
                # takes the stream itself.
                previous: Tuple[nn.Module, str] = (layer, "pre")
                for name, attn, norm, causal in attns:
                    stream = (norm, "pre") if layer.norm_first else previous
                    found.append(Sublayer(stack, i, name, [*attn.parameters(), *norm.parameters()], stream, norm,
                                          (attn, "pre_kwargs", self._mha_logits(causal))))
                    previous = (norm, "post")
                ffn = [*layer.linear1.parameters(), *layer.linear2.parameters(), *ffn_norm.parameters()]
                found.append(Sublayer(stack, i, "ffn", ffn, (ffn_norm, "pre") if layer.norm_first else previous,
                                      ffn_norm))
        return found

    @staticmethod
    def _mha_logits(causal: bool) -> Callable:
        def logits(mha: nn.MultiheadAttention, args, kwargs):
            query = args[0] if args else kwargs["query"]
            key = args[1] if len(args) > 1 else kwargs["key"]
            if not mha.batch_first:
                query, key = query.transpose(0, 1), key.transpose(0, 1)
            d, h = mha.embed_dim, mha.num_heads
            w_q, w_k = mha.in_proj_weight[:d], mha.in_proj_weight[d:2 * d]
            b_q, b_k = (mha.in_proj_bias[:d], mha.in_proj_bias[d:2 * d]) if mha.in_proj_bias is not None else (None, None)
            q = nn.functional.linear(query, w_q, b_q).unflatten(-1, (h, d // h)).transpose(1, 2)
            k = nn.functional.linear(key, w_k, b_k).unflatten(-1, (h, d // h)).transpose(1, 2)
            # The masks the model calls the attention with say which pairs it uses (an
            # nn.TransformerEncoder LM's causal mask, padded keys); without them, the layer's kind.
            mask, padding = kwargs.get("attn_mask"), kwargs.get("key_padding_mask")
            scores = attention_logits(q, k, causal if mask is None else False)  # scaled by 1 / sqrt(d_h)
            for hidden in (mask if mask is None or mask.dim() == 2 else mask.view(-1, h, *mask.shape[-2:]),
                           None if padding is None else padding[:, None, None, :]):
                if hidden is not None:
                    scores = scores.masked_fill(hidden, float("-inf")) if hidden.dtype == torch.bool else scores + hidden
            return scores.amax()
        return logits

    def probe_pass(self, batch):
        fast = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            with eval_mode(self.model), _captured_output(self.body) as box:
                output = call(self.model, batch)
        finally:
            torch.backends.mha.set_fastpath_enabled(fast)
        features = box[0]
        if not self._stacks()[0][1][0].self_attn.batch_first:  # (T, B, d) -> (B, T, d)
            features = features.transpose(0, 1)
        return features, logits_of(output)
