"""Hugging Face transformers models of one stack, by the layout of their blocks (`DECODER_LAYOUTS`)."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch.nn as nn

from stabexp.probes.adapters.base import Sublayer, has
from stabexp.probes.adapters.hugging_face import HFAdapter


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


class HFDecoderAdapter(HFAdapter):
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
            has(block, part) for block in blocks for part in _names(parts))), None)
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
