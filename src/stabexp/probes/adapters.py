"""Where a model's residual sublayers, stream norms and attention scores are: what the probes need
to know of a model, so that they run on stabexp's own models and on others alike (docs/probes.md,
"Adapters"; `stabexp.monitor` attaches them to a model and a loop of one's own).

An adapter lists the model's residual sublayers (`Sublayer`: its parameters, the module whose
input or output is the residual stream entering it, the norm on that stream, a hook giving its
attention logits) and runs the probe pass: the model in eval mode on the probe batch, returning
F(x, theta), the final hidden state before the output projection, and the logits. Seven come
with stabexp: `StabexpAdapter` (its own models, exact to the trainer's numbers),
`TorchTransformerAdapter` (a model built on torch.nn.Transformer or its encoder / decoder),
`HFDecoderAdapter` (Hugging Face transformers' decoders of the layouts in `DECODER_LAYOUTS`:
GPT-2, GPT-BigCode, GPT-NeoX, GPT-J, Llama and its kin, Gemma 2 / 3, Phi, Falcon), `HFOPTAdapter`
(OPT, Pre-LN or Post-LN), `HFEncoderAdapter` (BERT-style encoders), `HFSeq2SeqAdapter` (BART and
Marian) and `HFT5Adapter` (T5 and mT5). `adapter_for` picks one; any other model is a subclass of
`Adapter` with `sublayers` and `probe_pass`. The attention logits are read where the model
computes them: stabexp's own attention's `scores`, the masks nn.MultiheadAttention is called
with, and for the Hugging Face models the attention function they call
(`stabexp.probes.observed_attention`), so that every option the model applies to its scores is
in the number.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from stabexp.distributed import is_sharded
from stabexp.model.transformer import attention_logits, explicit_attention
from stabexp.modes import eval_mode
from stabexp.probes.observed_attention import ObservedAttention

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
        return _logits_of(_call(self.model, batch))

    def token_masks(self, batch) -> Dict[str, Optional[torch.Tensor]]:
        """Per stack, the real tokens of its input (B, T) bool; None: every position."""
        return {s.stack: None for s in self.sublayers()}

    def feature_mask(self, batch) -> Optional[torch.Tensor]:
        """The rows of F that are real tokens (B, T) bool; None: every row."""
        return None


class StabexpAdapter(Adapter):
    """stabexp's own models (model/): their `residuals()`, each sublayer's stream norm `ln`, and
    each attention's `scores`, through which the logits pass inside `explicit_attention()`."""

    def sublayers(self) -> List[Sublayer]:
        model = self.model
        attentions = list(model.attentions()) if hasattr(model, "attentions") else None
        found = []
        for i, (stack, layer, name, res) in enumerate(model.residuals()):
            attn = attentions[i] if attentions is not None else None
            found.append(Sublayer(stack, layer, name, list(res.parameters()), (res, "pre"), getattr(res, "ln", None),
                                  (attn.scores, "post", lambda module, args, logits: logits.amax())
                                  if attn is not None else None))
        return found

    def probe_pass(self, batch) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        src, tgt_in = batch[:2]
        # inference_mode spares the autograd bookkeeping that no_grad still does per operation
        # (about a tenth of this pass on a tiny model); not under FSDP2 (LayerProbe.measure_pass).
        with torch.inference_mode(not is_sharded(self.model)), eval_mode(self.model, only_if_dropout=True), \
                explicit_attention():
            return self.model.features(src, tgt_in), None

    def output(self, batch) -> torch.Tensor:
        return self.model(*batch[:2])

    def token_masks(self, batch):
        return self.model.token_masks(*batch[:2])

    def feature_mask(self, batch):
        return self.model.feature_mask(*batch[:2])


def _call(model: nn.Module, batch) -> Any:
    """A model called on a batch as it is usually called: keywords from a dict, arguments from a
    tuple or list, one tensor as it is."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _logits_of(output) -> Optional[torch.Tensor]:
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
                output = _call(self.model, batch)
        finally:
            torch.backends.mha.set_fastpath_enabled(fast)
        features = box[0]
        if not self._stacks()[0][1][0].self_attn.batch_first:  # (T, B, d) -> (B, T, d)
            features = features.transpose(0, 1)
        return features, _logits_of(output)


class _HFAdapter(Adapter):
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
        return self.features(output), _logits_of(output)

    def token_masks(self, batch):
        batch = batch if isinstance(batch, dict) else {}
        return {stack: batch[key].bool() if batch.get(key) is not None else None for stack, key in self.MASKS.items()}

    def feature_mask(self, batch):
        return self.token_masks(batch)[list(self.MASKS)[-1]]


class _HFEncoderDecoder(_HFAdapter):
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


# The decoder layouts HFDecoderAdapter knows, by the names of a block's children: (the
# attention's norm, the attention, the FFN's norm (None: one norm feeds both branches in
# parallel), the FFN, the norms on the branches' outputs (the attention's, the FFN's) or None).
# The first layout whose every name is in every block is the model's, so a layout whose names
# hold another's comes before it.
DECODER_LAYOUTS: Dict[str, Tuple[str, str, Optional[str], str, Optional[Tuple[str, str]]]] = {
    # Gemma 2 / 3: a norm before and after each branch ("sandwich"); the stream is the first's input.
    "gemma": ("input_layernorm", "self_attn", "pre_feedforward_layernorm", "mlp",
              ("post_attention_layernorm", "post_feedforward_layernorm")),
    # Llama, Mistral, Mixtral, Qwen2 / 3, StableLM, Phi-3, GLM, Granite and the like.
    "llama": ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp", None),
    # GPT-2 and GPT-BigCode (StarCoder).
    "gpt2": ("ln_1", "attn", "ln_2", "mlp", None),
    # GPT-NeoX (Pythia), its two branches in turn or in parallel, each from its own norm.
    "gpt_neox": ("input_layernorm", "attention", "post_attention_layernorm", "mlp", None),
    # Falcon with new_decoder_architecture: two norms, both branches in parallel from the stream.
    "falcon_two_norms": ("ln_attn", "self_attention", "ln_mlp", "mlp", None),
    # Falcon without parallel_attn: the branches in turn.
    "falcon": ("input_layernorm", "self_attention", "post_attention_layernorm", "mlp", None),
    # One norm feeding both branches in parallel: GPT-J; Phi, Cohere, StableLM with
    # use_parallel_residual; Falcon's default.
    "gptj": ("ln_1", "attn", None, "mlp", None),
    "phi": ("input_layernorm", "self_attn", None, "mlp", None),
    "falcon_parallel": ("input_layernorm", "self_attention", None, "mlp", None),
    # ModernBERT, an encoder: its first layer's attn_norm is an Identity (no norm on the stream).
    "modernbert": ("attn_norm", "attn", "mlp_norm", "mlp", None),
}
ENCODER_LAYOUTS = ("modernbert",)  # the layouts of encoders: their one stack is "encoder"


class HFDecoderAdapter(_HFAdapter):
    """A Hugging Face transformers model of one stack (built from a config or loaded) whose
    blocks (`base_model.h` or `base_model.layers`) are laid out as one of `DECODER_LAYOUTS`:
    the decoders GPT-2, GPT-BigCode, GPT-NeoX, GPT-J, Llama and the families of its layout,
    Gemma 2 / 3, Phi, Falcon, and the encoder ModernBERT (`ENCODER_LAYOUTS`: its stack is
    "encoder"; an Identity in a norm's place is no norm). Each layout is Pre-LN: the stream entering a sublayer is its norm's input;
    where one norm feeds both branches in parallel its weights count in the FFN's sublayer, and
    a norm on a branch's output (Gemma's) counts in that branch's. F(x, theta) is the last hidden
    state (after the final norm); the logits, the model's. The attention logits are the model's
    own, observed in its attention function (`observed_attention`). The batch is a dict of the
    model's inputs (input_ids, attention_mask) or the input ids."""

    def __init__(self, model: nn.Module):
        super().__init__(model)
        base = getattr(model, "base_model", model)
        blocks = list(getattr(base, "h", None) or getattr(base, "layers", None) or [])
        self.kind = next((kind for kind, parts in DECODER_LAYOUTS.items() if blocks and all(
            _has(block, part) for block in blocks for part in _names(parts))), None)
        self.blocks = blocks
        self.stack = "encoder" if self.kind in ENCODER_LAYOUTS else "decoder"
        self.MASKS = {self.stack: "attention_mask"}
        if self.kind is None:
            what = f"{type(model).__name__} ({getattr(model.config, 'model_type', '?')})"
            raise TypeError(f"{what} is laid out as none of the Hugging Face families the adapters know (the "
                            "decoder layouts of stabexp.probes.adapters.DECODER_LAYOUTS, OPT, BERT, BART, Marian, T5; "
                            "docs/probes.md, 'Adapters'): write a stabexp.probes.adapters.Adapter for it and pass "
                            "adapter=")

    def sublayers(self) -> List[Sublayer]:
        attn_norm, attn_name, ffn_norm, ffn_name, outputs = DECODER_LAYOUTS[self.kind]
        found = []
        for i, block in enumerate(self.blocks, start=1):
            attention, ffn = getattr(block, attn_name), getattr(block, ffn_name)
            norms = tuple(None if isinstance(n, nn.Identity) else n
                          for n in (getattr(block, attn_norm), getattr(block, ffn_norm or attn_norm)))
            streams = (getattr(block, attn_norm), getattr(block, ffn_norm or attn_norm))
            after = [getattr(block, name) for name in outputs] if outputs else [None, None]
            # One norm for both branches: its weights once, in the FFN's sublayer.
            own_norms = (None, norms[1]) if ffn_norm is None else norms
            for name, stream, norm, branch, own, out in zip(("self_attn", "ffn"), streams, norms, (attention, ffn),
                                                            own_norms, after):
                params = [*(own.parameters() if own is not None else ()), *branch.parameters(),
                          *(out.parameters() if out is not None else ())]
                found.append(Sublayer(self.stack, i, name, params, (stream, "pre"), norm,
                                      self.attention_hook(attention) if name == "self_attn" else None))
        return found


def _names(layout) -> List[str]:
    """The child names a decoder layout asks of a block."""
    attn_norm, attn, ffn_norm, ffn, outputs = layout
    return [n for n in (attn_norm, attn, ffn_norm, ffn) if n is not None] + list(outputs or ())


class HFOPTAdapter(_HFAdapter):
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
        self.layers = _opt_layers(model)
        self.pre_ln = bool(getattr(model.config, "do_layer_norm_before", True))

    @classmethod
    def knows(cls, model: nn.Module) -> bool:
        return getattr(model.config, "model_type", None) == "opt" and bool(_opt_layers(model))

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

class HFEncoderAdapter(_HFAdapter):
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
        self.layers = list(_encoder_layers(model))

    def sublayers(self) -> List[Sublayer]:
        found = []
        for i, layer in enumerate(self.layers, start=1):
            attention, attention_norm = layer.attention, layer.attention.output.LayerNorm
            found.append(Sublayer("encoder", i, "self_attn", list(attention.parameters()), (layer, "pre"),
                                  attention_norm, self.attention_hook(attention.self)))
            found.append(Sublayer("encoder", i, "ffn", [*layer.intermediate.parameters(), *layer.output.parameters()],
                                  (attention_norm, "post"), layer.output.LayerNorm))
        return found

class HFSeq2SeqAdapter(_HFEncoderDecoder):
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
                and all(_has(layer, part) for layer in encoder + decoder for part in cls.LAYOUT))

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


class HFT5Adapter(_HFEncoderDecoder):
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
            return (all(_has(part, f"{name}.{proj}") and _has(part, "layer_norm")
                        for part, name in attentions for proj in ("q", "k"))
                    and _has(parts[-1], "DenseReluDense") and _has(parts[-1], "layer_norm"))
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


def _opt_layers(model: nn.Module) -> List[nn.Module]:
    """The layers of an OPT decoder (HFOPTAdapter.LAYOUT in each), else []."""
    base = getattr(model, "base_model", model)
    layers = list(getattr(getattr(base, "decoder", None), "layers", None) or [])
    return layers if layers and all(_has(layer, part) for layer in layers for part in HFOPTAdapter.LAYOUT) else []


def _encoder_layers(model: nn.Module) -> List[nn.Module]:
    """The layers of a BERT-style encoder (HFEncoderAdapter.LAYOUT in each), else []."""
    base = getattr(model, "base_model", model)
    layers = list(getattr(getattr(base, "encoder", None), "layer", None) or [])
    return layers if layers and all(_has(layer, part) for layer in layers for part in HFEncoderAdapter.LAYOUT) else []


def _has(module: nn.Module, dotted: str) -> bool:
    for name in dotted.split("."):
        module = getattr(module, name, None)
        if module is None:
            return False
    return True


def adapter_for(model: nn.Module) -> Adapter:
    """The adapter of a model: stabexp's own, one built on torch.nn.Transformer, or a Hugging
    Face model one of the HF adapters knows (a GPT-2 / Llama-style decoder, OPT, a BERT-style
    encoder, BART / Marian, T5 / mT5); else of the one child of the model that is one of those (a
    LightningModule holding its network as `self.model`, say); a TypeError naming what to write
    otherwise."""
    if isinstance(model, Adapter):
        return model
    found = _known_adapter(model)
    if found is None:
        inner = [a for a in map(_known_adapter, model.children()) if a is not None]
        found = inner[0] if len(inner) == 1 else None
    if found is None:
        raise TypeError(f"no adapter knows {type(model).__name__}: pass the module that holds the layers, or "
                        "write a stabexp.probes.adapters.Adapter for it and pass adapter= (docs/probes.md, "
                        "'Adapters')")
    return found


def _known_adapter(model: nn.Module) -> Optional[Adapter]:
    if hasattr(model, "residuals") and hasattr(model, "features"):
        return StabexpAdapter(model)
    if hasattr(model, "config") and getattr(model.config, "model_type", None) is not None:
        for adapter in (HFSeq2SeqAdapter, HFT5Adapter, HFOPTAdapter):
            if adapter.knows(model):
                return adapter(model)
        return HFEncoderAdapter(model) if _encoder_layers(model) else HFDecoderAdapter(model)
    if any(isinstance(m, (nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder)) for m in model.modules()):
        return TorchTransformerAdapter(model)
    return None
