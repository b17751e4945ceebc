"""stabexp's own models (model/): the adapter exact to the trainer's numbers."""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from stabexp.distributed import is_sharded
from stabexp.model.transformer import explicit_attention
from stabexp.modes import eval_mode
from stabexp.probes.adapters.base import Adapter, Sublayer


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
