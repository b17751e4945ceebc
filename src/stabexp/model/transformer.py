"""Encoder-decoder Transformer with every residual placement of the stability studies.

Read top-down: attention, FFN, the residual sublayer (the one place where Post-LN, Pre-LN,
DeepNorm and Admin differ), the encoder and decoder layers, the model. Initialisation rules live
in model/init.py; this file only builds the shapes and the forward pass.

Padding (real text, `pad_id` set): sequences are padded on the right. The encoder's
self-attention and the decoder's cross-attention mask the padded source positions; the
decoder's causal mask already keeps every real target position away from the padding after it.
Padded positions compute values that nothing reads; losses and probes count real tokens only
(`token_masks`, `feature_mask`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class TransformerConfig:
    vocab_size: int            # shared source/target vocabulary (embeddings tied with the output)
    d_model: int = 64          # residual width d
    ffn_dim: int = 128         # FFN hidden width
    n_heads: int = 2           # attention heads
    encoder_layers: int = 6    # N
    decoder_layers: int = 6    # M
    residual: str = "postln"   # postln | preln | deepnorm | admin, see Residual.forward
    encoder_alpha: float = 1.0  # DeepNorm's residual scale alpha for the encoder stack
    decoder_alpha: float = 1.0  # ... and for the decoder stack
    dropout: float = 0.0       # on attention weights, branch outputs and embeddings
    max_len: int = 512         # positions covered by the sinusoidal table
    pad_id: Optional[int] = None  # padding token of variable-length batches; None: no masks


def token_mean(values: torch.Tensor, tokens: Optional[torch.Tensor]) -> torch.Tensor:
    """Mean of per-token values (B, T) over the real tokens (`tokens`, bool (B, T)), or over
    every position when there is no padding (tokens None). No host sync."""
    return values.mean() if tokens is None else (values * tokens).sum() / tokens.sum()


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV matrix. Init rules address W_Q, W_K, W_V
    as row blocks of `qkv.weight` (see `matrices`), so per-matrix rules stay exact."""

    def __init__(self, d: int, n_heads: int, causal: bool, dropout: float):
        super().__init__()
        self.n_heads, self.causal, self.dropout = n_heads, causal, dropout
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def matrices(self) -> Dict[str, torch.Tensor]:
        d = self.out.weight.shape[0]
        w = self.qkv.weight
        return {"q": w[:d], "k": w[d:2 * d], "v": w[2 * d:], "o": self.out.weight}

    def forward(self, x: torch.Tensor, key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """key_mask: (B, 1, 1, T), True where a key is a real token (encoder only)."""
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=key_mask, is_causal=self.causal,
            dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, d))


class CrossAttention(nn.Module):
    """Decoder-to-encoder attention: W_Q on the decoder state, fused W_K|W_V on the memory."""

    def __init__(self, d: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)

    def matrices(self) -> Dict[str, torch.Tensor]:
        d = self.q.weight.shape[0]
        return {"q": self.q.weight, "k": self.kv.weight[:d], "v": self.kv.weight[d:],
                "o": self.out.weight}

    def forward(self, x: torch.Tensor, memory: torch.Tensor,
                memory_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, T, d = x.shape
        S, h = memory.shape[1], self.n_heads
        q = self.q(x).view(B, T, h, d // h).transpose(1, 2)
        k, v = self.kv(memory).view(B, S, 2, h, d // h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=memory_mask,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, d))


class FeedForward(nn.Module):
    def __init__(self, d: int, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(d, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d)

    def matrices(self) -> Dict[str, torch.Tensor]:
        return {"w1": self.fc1.weight, "w2": self.fc2.weight}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class Residual(nn.Module):
    """One residual sublayer x <- combine(x, G(x)), G = `branch`. REFERENCE.md Sec. 1."""

    def __init__(self, branch: nn.Module, d: int, style: str, alpha: float, dropout: float):
        super().__init__()
        self.branch, self.style, self.alpha, self.dropout = branch, style, alpha, dropout
        self.ln = nn.LayerNorm(d)
        if style == "admin":
            # Admin's omega: a learnable per-dimension residual scale (Liu et al. 2020, eq. 7),
            # set by profiling in init.py before training.
            self.omega = nn.Parameter(torch.ones(d))
        # Probe hooks, off in normal training: see probes/ and init.admin_profile.
        self.record_ln_input = False
        self.ln_input_mask: Optional[torch.Tensor] = None  # (B, T) real tokens, None: all
        self.ln_input_norm: Optional[torch.Tensor] = None
        self.admin_profile = None

    def forward(self, x: torch.Tensor, *context: torch.Tensor) -> torch.Tensor:
        if self.style == "preln":                       # Xiong et al. 2020
            return x + self._g(self._ln(x), *context)
        g = self._g(x, *context)
        if self.style == "postln":                      # Vaswani et al. 2017
            return self._ln(x + g)
        if self.style == "deepnorm":                    # DeepNet eq. (Sec. 2.3): LN(alpha x + G(x))
            return self._ln(self.alpha * x + g)
        if self.style == "admin":                       # Admin eq. 7: LN(omega * x + G(x))
            if self.admin_profile is not None:
                self.admin_profile.step(self, x, g)
            return self._ln(self.omega * x + g)
        raise ValueError(f"unknown residual style {self.style!r}")

    def _g(self, x: torch.Tensor, *context: torch.Tensor) -> torch.Tensor:
        g = self.branch(x, *context)
        return F.dropout(g, self.dropout, self.training) if self.dropout > 0 else g

    def _ln(self, x: torch.Tensor) -> torch.Tensor:
        if self.record_ln_input:
            # DeepNet Fig. 3(b,c): mean over (real) tokens of the L2 norm of the LN input.
            self.ln_input_norm = token_mean(x.detach().norm(dim=-1), self.ln_input_mask)
        return self.ln(x)


class EncoderLayer(nn.Module):
    def __init__(self, c: TransformerConfig):
        super().__init__()
        d, a = c.d_model, c.encoder_alpha
        self.self_attn = Residual(SelfAttention(d, c.n_heads, False, c.dropout), d, c.residual, a, c.dropout)
        self.ffn = Residual(FeedForward(d, c.ffn_dim), d, c.residual, a, c.dropout)

    def forward(self, x: torch.Tensor, key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.ffn(self.self_attn(x, key_mask))


class DecoderLayer(nn.Module):
    def __init__(self, c: TransformerConfig):
        super().__init__()
        d, a = c.d_model, c.decoder_alpha
        self.self_attn = Residual(SelfAttention(d, c.n_heads, True, c.dropout), d, c.residual, a, c.dropout)
        self.cross_attn = Residual(CrossAttention(d, c.n_heads, c.dropout), d, c.residual, a, c.dropout)
        self.ffn = Residual(FeedForward(d, c.ffn_dim), d, c.residual, a, c.dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor,
                memory_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.ffn(self.cross_attn(self.self_attn(x), memory, memory_mask))


def sinusoidal_positions(max_len: int, d: int) -> torch.Tensor:
    """Vaswani et al. 2017 Sec. 3.5 (fairseq's layout: sines then cosines)."""
    half = d // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / max(half - 1, 1)))
    angle = torch.arange(max_len, dtype=torch.float32)[:, None] * freq[None, :]
    table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)
    return F.pad(table, (0, d - 2 * half))


class Seq2SeqTransformer(nn.Module):
    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.register_buffer("positions", sinusoidal_positions(c.max_len, c.d_model), persistent=False)
        self.encoder = nn.ModuleList(EncoderLayer(c) for _ in range(c.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(c) for _ in range(c.decoder_layers))
        # Pre-LN leaves the residual stream un-normalised, so each stack ends with an LN.
        final = (lambda: nn.LayerNorm(c.d_model)) if c.residual == "preln" else nn.Identity
        self.encoder_final_ln, self.decoder_final_ln = final(), final()

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        # fairseq scales embeddings by sqrt(d) so they match the sinusoids' scale.
        x = self.embed(tokens) * math.sqrt(self.config.d_model) + self.positions[: tokens.shape[1]]
        return F.dropout(x, self.config.dropout, self.training)

    def token_masks(self, src: torch.Tensor, tgt_in: torch.Tensor) -> Dict[str, Optional[torch.Tensor]]:
        """The real tokens of each stack's input, {"encoder": (B, S), "decoder": (B, T)} bool;
        None for both when the model has no padding. BOS starts every target, so tgt_in marks
        the same positions as the targets it predicts (and as F's rows)."""
        if self.config.pad_id is None:
            return {"encoder": None, "decoder": None}
        return {"encoder": src != self.config.pad_id, "decoder": tgt_in != self.config.pad_id}

    def feature_mask(self, src: torch.Tensor, tgt_in: torch.Tensor) -> Optional[torch.Tensor]:
        """The rows of F(x, theta) (and of the logits) that are real target tokens."""
        return self.token_masks(src, tgt_in)["decoder"]

    def key_mask(self, src: torch.Tensor) -> Optional[torch.Tensor]:
        """Attention mask over the source keys, (B, 1, 1, S): True where attention may look."""
        return None if self.config.pad_id is None else (src != self.config.pad_id)[:, None, None, :]

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        key_mask = self.key_mask(src)
        x = self._embed(src)
        for layer in self.encoder:
            x = layer(x, key_mask)
        return self.encoder_final_ln(x)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor,
               memory_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """The top decoder output for `tgt_in` given the encoder output (B, T, d)."""
        y = self._embed(tgt_in)
        for layer in self.decoder:
            y = layer(y, memory, memory_mask)
        return self.decoder_final_ln(y)

    def features(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """F(x, theta): the top decoder output before the vocabulary projection, (B, T, d)."""
        return self.decode(tgt_in, self.encode(src), self.key_mask(src))

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return F.linear(features, self.embed.weight)  # tied with the input embeddings

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.logits(self.features(src, tgt_in))

    def residuals(self) -> Iterator[Tuple[str, int, str, Residual]]:
        """(stack, layer 1-based from the bottom, sublayer name, module), bottom-up per stack."""
        for stack, layers in (("encoder", self.encoder), ("decoder", self.decoder)):
            for i, layer in enumerate(layers, start=1):
                for name in ("self_attn", "cross_attn", "ffn"):
                    if hasattr(layer, name):
                        yield stack, i, name, getattr(layer, name)
