"""Encoder-decoder Transformer, built with any residual placement of the stability studies (the
single-stack models of model/lm.py reuse its layers).

Read top-down: the branches (attention, FFN) with their optional slots, DLCL's dense
layer history, the layers, the model. The norms are model/norms.py's; the residual placements
(one small class each, its formula and citation in its forward, and PLACEMENTS: which pieces
each `residual` style builds) are model/placements.py's, and a layer asks `layer_placement` for
its own. Initialisation rules live in model/init.py; this file only builds the shapes and the
forward.

What the studies measure is read from outside, by PyTorch forward hooks on named submodules,
so that nothing here computes a statistic (the measurements and Admin's profiling in
model/init.py attach them):
- each residual sublayer `res` of `residuals()`: its input is the residual stream x;
- `res.ln`, the norm on the residual stream (placements without one have none): its input is
  the "LN input" of DeepNet's Fig. 4, LN(x + G) for Post-LN, LN(x) for Pre-LN;
- `res.branch`, the sublayer's G, and `res.drop` when the sublayer has dropout: the output of
  the last of the two is G(x) as Admin adds it to the stream (Sandwich-LN and NormFormer's
  self-attention normalise it with `ln_out` before adding it);
- `attn.scores` of each attention, inside `explicit_attention()`: the masked logits
  q·k/√d_h pass through it; `attn.mix`, there too, takes the attention weights and the values
  and returns their weighted sum. Outside that block attention runs PyTorch's fused kernel.

Padding (real text, `pad_id` set): sequences are padded on the right. The encoder's
self-attention and the decoder's cross-attention mask the padded source positions; the
decoder's causal mask already keeps every real target position away from the padding after it.
Padded positions compute values that nothing reads; losses and measurements count real tokens only
(`token_masks`, `feature_mask`).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from stabexp import plugins
from stabexp.model.norms import DyT, make_norm
from stabexp.model.placements import Residual, layer_placement
from stabexp.model_options import TransformerConfig


# --- branches G: attention and FFN, each with optional slots that placements fill ---------

def _head_norms(c: "TransformerConfig", v: bool = False) -> Tuple[Optional[nn.Module], ...]:
    """Norms over each head's d_h features, after the projections (as timm's
    `q_norm = norm_layer(head_dim)`), in the model's norm kind: of q and k before q.k / sqrt(d_h)
    with QK-LayerNorm (Dehghani et al. 2023, arXiv 2302.05442; Wortsman et al. 2023), and of
    q, k and v with `v` (HybridNorm's QKV-norm). (None, None, None) when neither applies."""
    d_head = c.d_model // c.n_heads
    q_k = c.qk_norm or v
    return (make_norm(c.norm, d_head) if q_k else None, make_norm(c.norm, d_head) if q_k else None,
            make_norm(c.norm, d_head) if v else None)


def attention_logits(q: torch.Tensor, k: torch.Tensor, causal: bool,
                     key_mask: Optional[torch.Tensor] = None, scale: Optional[float] = None) -> torch.Tensor:
    """q.k / sqrt(d_h) per (batch, head, query, key), -inf where the attention may not look.
    q: (B, h, T, d_h), k: (B, h, S, d_h); key_mask (B, 1, 1, S) True where a key is real;
    `scale`: q.k times it instead (a model whose attention scales otherwise)."""
    scores = q @ k.transpose(-1, -2)
    logits = scores / math.sqrt(q.shape[-1]) if scale is None else scores * scale
    hidden = None
    if causal:
        hidden = torch.ones(logits.shape[-2:], dtype=torch.bool, device=q.device).triu_(1)
    if key_mask is not None:
        hidden = ~key_mask if hidden is None else hidden | ~key_mask
    return logits if hidden is None else logits.masked_fill(hidden, float("-inf"))


def softmax_over_keys(logits: torch.Tensor) -> torch.Tensor:
    """softmax(logits) along the keys (the last dimension). On a CPU, rows of fewer than 16 keys
    take torch's softmax along the other dimension of the transposed view: the same function,
    about 3x faster there (torch 2.13's CPU kernel along the last dimension is slow on short
    rows, and slower along another one on long rows; docs/benchmarks.md)."""
    if logits.device.type == "cpu" and logits.shape[-1] < 16:
        return logits.transpose(-1, -2).softmax(-2).transpose(-1, -2)
    return logits.softmax(-1)


class WeightedSum(nn.Module):
    """weights @ v: each query's attention weights (after dropout) times the values, as a module
    so that a forward hook sees both and the sum (DeepNet's Lemma 1 is about this step)."""

    def forward(self, weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return weights @ v


class _AttentionKernel:
    explicit = False  # True inside explicit_attention()


_KERNEL = _AttentionKernel()


@contextmanager
def explicit_attention():
    """Inside the block every attention computes softmax(q.k / sqrt(d_h) + mask) v by hand
    instead of calling the fused kernel, so that its logits pass through `scores`, where a
    forward hook can read them. The result equals the fused kernel's up to rounding (about
    1e-7). The measurements use it in eval mode; QK-Clip (train/qk_clip.py) in training, with the
    attention dropout drawn by hand."""
    previous, _KERNEL.explicit = _KERNEL.explicit, True
    try:
        yield
    finally:
        _KERNEL.explicit = previous


class _Attention(nn.Module):
    """What both attentions share: the optional per-head q / k norms, and the two ways of
    computing attention (the fused kernel, or by hand inside `explicit_attention()`)."""

    def _setup(self, n_heads: int, dropout: float, head_norms):
        self.n_heads, self.dropout = n_heads, dropout
        # None rather than identities: a module call per attention costs a deep tiny model time.
        self.q_norm, self.k_norm, self.v_norm = head_norms if head_norms is not None else (None, None, None)
        self.scores = nn.Identity()  # the logits pass through it on the explicit path only
        self.mix = WeightedSum()     # weights @ v, on the explicit path only

    def _attend(self, q, k, v, mask, causal: bool) -> torch.Tensor:
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        if _KERNEL.explicit:
            weights = softmax_over_keys(self.scores(attention_logits(q, k, causal, mask)))
            return self.mix(F.dropout(weights, self.dropout, self.training), v)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              dropout_p=self.dropout if self.training else 0.0)


class SelfAttention(_Attention):
    """Multi-head self-attention with one fused QKV matrix. Init rules address W_Q, W_K, W_V
    as row blocks of `qkv.weight` (see `matrices`), so per-matrix rules stay exact.
    Slots: `inner` acts on the concatenated heads before W_O, `post` on W_O's output;
    `head_norms` the per-head (q, k, v) norms of _head_norms."""

    def __init__(self, d: int, n_heads: int, causal: bool, dropout: float, bias: bool = True,
                 inner: Optional[nn.Module] = None, post: Optional[nn.Module] = None, head_norms=None):
        super().__init__()
        self._setup(n_heads, dropout, head_norms)
        self.causal = causal
        self.qkv = nn.Linear(d, 3 * d, bias=bias)
        self.out = nn.Linear(d, d, bias=bias)
        self.inner = inner if inner is not None else nn.Identity()
        self.post = post if post is not None else nn.Identity()

    def matrices(self) -> Dict[str, torch.Tensor]:
        d = self.out.weight.shape[0]
        w = self.qkv.weight
        return {"q": w[:d], "k": w[d:2 * d], "v": w[2 * d:], "o": self.out.weight}

    def biases(self) -> Dict[str, torch.Tensor]:
        """The bias of each matrix of `matrices`; empty without biases (Fixup)."""
        if self.out.bias is None:
            return {}
        d, b = self.out.weight.shape[0], self.qkv.bias
        return {"q": b[:d], "k": b[d:2 * d], "v": b[2 * d:], "o": self.out.bias}

    def forward(self, x: torch.Tensor, key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """key_mask: (B, 1, 1, T), True where a key is a real token (encoder only)."""
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        y = self._attend(q, k, v, key_mask, self.causal)
        return self.post(self.out(self.inner(y.transpose(1, 2).reshape(B, T, d))))


class CrossAttention(_Attention):
    """Decoder-to-encoder attention: W_Q on the decoder state, fused W_K|W_V on the memory."""

    def __init__(self, d: int, n_heads: int, dropout: float, bias: bool = True, head_norms=None):
        super().__init__()
        self._setup(n_heads, dropout, head_norms)
        self.q = nn.Linear(d, d, bias=bias)
        self.kv = nn.Linear(d, 2 * d, bias=bias)
        self.out = nn.Linear(d, d, bias=bias)

    def matrices(self) -> Dict[str, torch.Tensor]:
        d = self.q.weight.shape[0]
        return {"q": self.q.weight, "k": self.kv.weight[:d], "v": self.kv.weight[d:],
                "o": self.out.weight}

    def biases(self) -> Dict[str, torch.Tensor]:
        if self.out.bias is None:
            return {}
        d = self.q.weight.shape[0]
        return {"q": self.q.bias, "k": self.kv.bias[:d], "v": self.kv.bias[d:], "o": self.out.bias}

    def forward(self, x: torch.Tensor, memory: torch.Tensor,
                memory_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, T, d = x.shape
        S, h = memory.shape[1], self.n_heads
        q = self.q(x).view(B, T, h, d // h).transpose(1, 2)
        k, v = self.kv(memory).view(B, S, 2, h, d // h).permute(2, 0, 3, 1, 4)
        y = self._attend(q, k, v, memory_mask, False)
        return self.out(y.transpose(1, 2).reshape(B, T, d))


class FeedForward(nn.Module):
    """fc2(inner(ReLU(pre_act(fc1 x)))); the slots are identities unless a placement fills them."""

    def __init__(self, d: int, ffn_dim: int, bias: bool = True,
                 pre_act: Optional[nn.Module] = None, inner: Optional[nn.Module] = None):
        super().__init__()
        self.fc1 = nn.Linear(d, ffn_dim, bias=bias)
        self.fc2 = nn.Linear(ffn_dim, d, bias=bias)
        self.pre_act = pre_act if pre_act is not None else nn.Identity()
        self.inner = inner if inner is not None else nn.Identity()

    def matrices(self) -> Dict[str, torch.Tensor]:
        return {"w1": self.fc1.weight, "w2": self.fc2.weight}

    def biases(self) -> Dict[str, torch.Tensor]:
        return {} if self.fc1.bias is None else {"w1": self.fc1.bias, "w2": self.fc2.bias}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.inner(F.relu(self.pre_act(self.fc1(x)))))


def _slot(make: Optional[Callable], c: TransformerConfig) -> Optional[nn.Module]:
    return make(c) if make is not None else None


class DenseHistory(nn.Module):
    """DLCL's learnable dense layer history (fairseq layer_history.py, LearnableDenseLayerHistory):
    with y_0 the embedding and y_k = LN_k(output of layer k), the input of layer l + 1 is
    sum_{k <= l} W[l, k] y_k, W lower-triangular, each row initialised to the uniform average."""

    def __init__(self, n_layers: int, c: TransformerConfig):
        super().__init__()
        w = torch.ones(n_layers + 1, n_layers + 1).tril()
        self.weight = nn.Parameter(w / w.sum(1, keepdim=True))
        self.norms = nn.ModuleList(make_norm(c.norm, c.d_model) for _ in range(n_layers))

    def forward(self, outputs: List[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        """Store layer len(outputs)'s output y (normalised) and return the next layer's input."""
        outputs.append(self.norms[len(outputs) - 1](y))
        row = self.weight[len(outputs) - 1, : len(outputs)]
        return (torch.stack(outputs) * row.view(-1, 1, 1, 1)).sum(0)


# --- layers --------------------------------------------------------------------------------

class EncoderLayer(nn.Module):
    """Self-attention then FFN: a layer of the encoder, or with causal=True (stack "decoder")
    a layer of a decoder-only model, which has no cross-attention (model/lm.py)."""

    def __init__(self, c: TransformerConfig, causal: bool = False, stack: str = "encoder", layer: int = 1):
        super().__init__()
        p, d, shared = layer_placement(c, stack, layer), c.d_model, {}
        attn = SelfAttention(d, c.n_heads, causal, c.dropout, p.bias, _slot(p.attn_inner, c), _slot(p.attn_post, c),
                             _head_norms(c, v=p.qkv_norm))
        self.self_attn = (p.self_attn or p.residual)(attn, c, stack, shared, layer)
        ffn = FeedForward(d, c.ffn_dim, p.bias, _slot(p.ffn_pre_act, c), _slot(p.ffn_inner, c))
        self.ffn = p.residual(ffn, c, stack, shared, layer)

    def forward(self, x: torch.Tensor, key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.ffn(self.self_attn(x, key_mask))


class DecoderLayer(nn.Module):
    def __init__(self, c: TransformerConfig, layer: int = 1):
        super().__init__()
        p, d, shared = layer_placement(c, "decoder", layer), c.d_model, {}
        attn = SelfAttention(d, c.n_heads, True, c.dropout, p.bias, _slot(p.attn_inner, c), _slot(p.attn_post, c),
                             _head_norms(c, v=p.qkv_norm))
        self.self_attn = (p.self_attn or p.residual)(attn, c, "decoder", shared, layer)
        cross = CrossAttention(d, c.n_heads, c.dropout, p.bias, _head_norms(c))
        self.cross_attn = p.residual(cross, c, "decoder", shared, layer)
        ffn = FeedForward(d, c.ffn_dim, p.bias, _slot(p.ffn_pre_act, c), _slot(p.ffn_inner, c))
        self.ffn = p.residual(ffn, c, "decoder", shared, layer)

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


class TokenModel(nn.Module):
    """What every Transformer here shares: token embeddings tied with the output projection,
    sinusoidal positions, and the stack walk with DLCL's optional dense history."""

    def __init__(self, c: TransformerConfig, stacks=("encoder", "decoder")):
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.register_buffer("positions", sinusoidal_positions(c.max_len, c.d_model), persistent=False)
        self.input_scale = (nn.ParameterDict({s: nn.Parameter(torch.ones(c.d_model)) for s in stacks})
                            if c.input_scale else None)
        self.embed_scale = nn.Parameter(torch.full((1,), math.sqrt(c.d_model))) if c.learnable_embed_scale else None
        embed_norms = {s: make_norm(c.norm, c.d_model) for s in stacks
                       if plugins.placement(c.placement(s)).embed_norm}
        self.embed_norm = nn.ModuleDict(embed_norms) if embed_norms else None

    def _set_dyt_alphas(self) -> None:
        """norm=dyt: every DyT's alpha_0 is model.dyt_alpha, except at the sites whose own value
        is set (model.dyt_alpha_attn / _ffn / _final): a sublayer's norms, qk-norms included,
        take its branch's value, the norm on top of a stack the final one."""
        c = self.config
        if c.norm != "dyt":
            return
        sites = [(self, c.dyt_alpha)]
        sites += [(res, c.dyt_alpha_attn if isinstance(res.branch, _Attention) else c.dyt_alpha_ffn)
                  for *_, res in self.residuals()]
        sites += [(getattr(self, f"{s}_final_ln"), c.dyt_alpha_final) for s in ("encoder", "decoder")
                  if hasattr(self, f"{s}_final_ln")]
        with torch.no_grad():
            for module, alpha in sites:
                for m in module.modules():
                    if isinstance(m, DyT) and alpha is not None:
                        m.alpha.fill_(alpha)

    def _embed(self, tokens: torch.Tensor, stack: str) -> torch.Tensor:
        # fairseq scales embeddings by sqrt(d) so they match the sinusoids' scale.
        scale = self.embed_scale if self.embed_scale is not None else math.sqrt(self.config.d_model)
        x = self.embed(tokens) * scale + self.positions[: tokens.shape[1]]
        if self.input_scale is not None:
            x = x * self.input_scale[stack]
        if self.embed_norm is not None:
            x = self.embed_norm[stack](x)
        return F.dropout(x, self.config.dropout, self.training)

    # Activation checkpointing (train.activation_checkpointing): a training forward keeps only
    # each layer's input and recomputes the layer in the backward pass (torch.utils.checkpoint,
    # non-reentrant, with the dropout masks of the first pass), trading one more forward for
    # the memory of every layer's intermediate activations. Set by the run, off in eval.
    checkpoint_layers: bool = False

    def _run_stack(self, layers, history: Optional[DenseHistory], x: torch.Tensor, *context) -> torch.Tensor:
        outputs = [x]
        recompute = self.checkpoint_layers and self.training and torch.is_grad_enabled()
        for layer in layers:
            y = checkpoint(layer, x, *context, use_reentrant=False) if recompute else layer(x, *context)
            x = history(outputs, y) if history is not None else y
        return x

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return F.linear(features, self.embed.weight)  # tied with the input embeddings

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.logits(self.features(src, tgt_in))

    def attentions(self) -> Iterator[Optional[nn.Module]]:
        """The attention of each residual sublayer in `residuals()` order (None for an FFN)."""
        for *_, res in self.residuals():
            yield res.branch if isinstance(res.branch, _Attention) else None


class Seq2SeqTransformer(TokenModel):
    def __init__(self, c: TransformerConfig):
        super().__init__(c)
        self.encoder = nn.ModuleList(EncoderLayer(c, layer=i) for i in range(1, c.encoder_layers + 1))
        self.decoder = nn.ModuleList(DecoderLayer(c, layer=i) for i in range(1, c.decoder_layers + 1))
        # Each stack ends as its own placement says (a hybrid's Pre-LN stack gets its final LN).
        pe, pd = plugins.placement(c.placement("encoder")), plugins.placement(c.placement("decoder"))
        self.encoder_final_ln = pe.final(c, "encoder") if pe.final else nn.Identity()
        self.decoder_final_ln = pd.final(c, "decoder") if pd.final else nn.Identity()
        self.encoder_history = DenseHistory(c.encoder_layers, c) if pe.dense_history else None
        self.decoder_history = DenseHistory(c.decoder_layers, c) if pd.dense_history else None
        self._set_dyt_alphas()

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
        x = self._run_stack(self.encoder, self.encoder_history, self._embed(src, "encoder"), self.key_mask(src))
        return self.encoder_final_ln(x)

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor,
               memory_mask: Optional[torch.Tensor]) -> torch.Tensor:
        """The top decoder output for `tgt_in` given the encoder output (B, T, d)."""
        x = self._run_stack(self.decoder, self.decoder_history, self._embed(tgt_in, "decoder"), memory, memory_mask)
        return self.decoder_final_ln(x)

    def features(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """F(x, theta): the top decoder output before the vocabulary projection, (B, T, d)."""
        return self.decode(tgt_in, self.encode(src), self.key_mask(src))

    def residuals(self) -> Iterator[Tuple[str, int, str, Residual]]:
        """(stack, layer 1-based from the bottom, sublayer name, module), bottom-up per stack."""
        for stack, layers in (("encoder", self.encoder), ("decoder", self.decoder)):
            for i, layer in enumerate(layers, start=1):
                for name in ("self_attn", "cross_attn", "ffn"):
                    if hasattr(layer, name):
                        yield stack, i, name, getattr(layer, name)
