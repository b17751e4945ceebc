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
`Adapter` with `sublayers` and `probe_pass`. One module each: base.py (Sublayer, Adapter),
stabexp_model.py, torch_nn.py, hugging_face.py (what the Hugging Face ones share), hf_decoder.py,
hf_opt.py, hf_bert.py, hf_bart.py, hf_t5.py. The attention logits are read where the model
computes them: stabexp's own attention's `scores`, the masks nn.MultiheadAttention is called
with, and for the Hugging Face models the attention function they call
(`stabexp.probes.observed_attention`), so that every option the model applies to its scores is
in the number.
"""

from __future__ import annotations

from typing import Optional

import torch.nn as nn

from stabexp.probes.adapters.base import Adapter, Hook, Sublayer
from stabexp.probes.adapters.hf_bart import HFSeq2SeqAdapter
from stabexp.probes.adapters.hf_bert import HFEncoderAdapter, encoder_layers
from stabexp.probes.adapters.hf_decoder import DECODER_LAYOUTS, ENCODER_LAYOUTS, HFDecoderAdapter
from stabexp.probes.adapters.hf_opt import HFOPTAdapter
from stabexp.probes.adapters.hf_t5 import HFT5Adapter
from stabexp.probes.adapters.stabexp_model import StabexpAdapter
from stabexp.probes.adapters.torch_nn import TorchTransformerAdapter

__all__ = ["Adapter", "Hook", "Sublayer", "StabexpAdapter", "TorchTransformerAdapter", "HFDecoderAdapter",
           "DECODER_LAYOUTS", "ENCODER_LAYOUTS", "HFOPTAdapter", "HFEncoderAdapter", "HFSeq2SeqAdapter",
           "HFT5Adapter", "adapter_for"]

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
        return HFEncoderAdapter(model) if encoder_layers(model) else HFDecoderAdapter(model)
    if any(isinstance(m, (nn.Transformer, nn.TransformerEncoder, nn.TransformerDecoder)) for m in model.modules()):
        return TorchTransformerAdapter(model)
    return None
