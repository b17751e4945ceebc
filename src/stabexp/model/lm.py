"""Single-stack Transformers: a decoder-only causal language model (GPT) and an encoder-only
bidirectional stack (BERT), built from the layers of transformer.py with any placement that has
a meaning for one stack.

The trainer's calls keep their shape, model(src, tgt_in): a single-stack model reads only
`tgt_in` (the token sequence; the language-modelling task passes an empty src). F(x, theta),
the features the measurements read, is the top hidden state before the tied output projection, as for the
encoder-decoder. Layers are bottom-up in `decoder` (decoder-only) or `encoder` (encoder-only);
the other stack is empty, so per-stack init rules see one stack of L layers and use the
single-stack constants (model/init.py).
"""

from __future__ import annotations

from typing import Dict, Iterator, Optional, Tuple

import torch
import torch.nn as nn

from stabexp import plugins
from stabexp.model.placements import Residual
from stabexp.model.transformer import DenseHistory, EncoderLayer, TokenModel
from stabexp.model_options import TransformerConfig

# model.arch values of the single-stack models, and the stack each one names its layers by.
SINGLE_STACK = {"decoder_only": "decoder", "encoder_only": "encoder"}


class LanguageModel(TokenModel):
    """`arch` decoder_only: causal self-attention, layer count c.decoder_layers; encoder_only:
    bidirectional, c.encoder_layers. No padding: the task cuts fixed-length windows of text."""

    def __init__(self, c: TransformerConfig, arch: str):
        super().__init__(c, stacks=(SINGLE_STACK[arch],))
        self.arch, self.stack = arch, SINGLE_STACK[arch]
        p = plugins.placement(c.residual)
        causal = self.stack == "decoder"
        n = c.decoder_layers if causal else c.encoder_layers
        layers = nn.ModuleList(EncoderLayer(c, causal=causal, stack=self.stack, layer=i) for i in range(1, n + 1))
        self.encoder = nn.ModuleList() if causal else layers
        self.decoder = layers if causal else nn.ModuleList()
        final = p.final(c, self.stack) if p.final else nn.Identity()
        history = DenseHistory(n, c) if p.dense_history else None
        setattr(self, f"{self.stack}_final_ln", final)
        setattr(self, f"{self.stack}_history", history)
        self._set_dyt_alphas()

    @property
    def layers(self) -> nn.ModuleList:
        return self.decoder if self.stack == "decoder" else self.encoder

    def token_masks(self, src: torch.Tensor, tgt_in: torch.Tensor) -> Dict[str, Optional[torch.Tensor]]:
        return {self.stack: None}

    def feature_mask(self, src: torch.Tensor, tgt_in: torch.Tensor) -> Optional[torch.Tensor]:
        return None

    def features(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """F(x, theta): the top hidden state of the stack over the sequence tgt_in, (B, T, d)."""
        history = getattr(self, f"{self.stack}_history")
        x = self._run_stack(self.layers, history, self._embed(tgt_in, self.stack))
        return getattr(self, f"{self.stack}_final_ln")(x)

    def residuals(self) -> Iterator[Tuple[str, int, str, Residual]]:
        for i, layer in enumerate(self.layers, start=1):
            for name in ("self_attn", "ffn"):
                yield self.stack, i, name, getattr(layer, name)
