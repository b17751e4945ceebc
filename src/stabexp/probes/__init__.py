"""Probes: what the studies measure, computed on device with one host sync per probe.

- model_update: DeepNet Sec. 3 / Fig. 3(a), ||F(x, theta_i) - F(x, theta_0)||.
- per-sublayer gradient norms: DeepNet Fig. 3(d) / Fig. 2.
- ln_input_norm: DeepNet Fig. 3(b,c), the mean L2 norm of each LayerNorm's input.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from stabexp.model.transformer import Seq2SeqTransformer, token_mean


def model_update(features: torch.Tensor, features_init: torch.Tensor,
                 tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """||F(x, theta_i) - F(x, theta_0)|| for F of shape (B, T, d), normalised per token:
    sqrt(mean over the B*T target tokens of ||dF_token||_2^2) = ||dF||_F / sqrt(B T).
    The Frobenius norm of the whole batch would grow like sqrt(B T); this does not, so the
    value does not depend on the probe batch size (DeepNet does not state its normalisation).
    With `tokens` (B, T), the mean runs over the real (unpadded) target tokens only."""
    return token_mean((features - features_init).pow(2).sum(-1), tokens).sqrt()


class LayerProbe:
    """Per-sublayer statistics of a model, in `model.residuals()` order.

    The parameters of a sublayer are its branch (attention or FFN), its norms and its
    placement's scalars (Admin's omega, Fixup's shift and scale); a parameter shared by the
    sublayers of a layer (ReZero's alpha) counts in the layer's last one. Norms come from one torch._foreach_norm over all gradients, summed per
    sublayer on device, so there is no Python work per parameter beyond building lists.
    """

    def __init__(self, model: Seq2SeqTransformer):
        self.model = model
        self.keys: List[Tuple[str, int, str]] = []
        self.residuals = [res for *_, res in model.residuals()]
        self.stacks = [stack for stack, *_ in model.residuals()]
        sublayer_of = {}
        for i, (stack, layer, name, res) in enumerate(model.residuals()):
            self.keys.append((stack, layer, name))
            for p in res.parameters():
                sublayer_of[id(p)] = i
        self.params = list(model.parameters())
        # Bucket of each parameter: its sublayer, or len(keys) for embeddings and final LNs.
        owner = [sublayer_of.get(id(p), len(self.keys)) for p in self.params]
        self.owner = torch.tensor(owner, dtype=torch.long, device=self.params[0].device)

    def grad_norms(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(total gradient norm of the model, gradient norm per sublayer), from one
        torch._foreach_norm over all gradients; NaN before any backward pass."""
        n = len(self.keys)
        if all(p.grad is None for p in self.params):
            nan = torch.full((), float("nan"), device=self.owner.device)
            return nan, torch.full((n,), float("nan"), device=self.owner.device)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        sq = torch.stack(torch._foreach_norm(grads)).float() ** 2
        buckets = torch.zeros(n + 1, device=sq.device).index_add_(0, self.owner, sq)
        return buckets.sum().sqrt(), buckets[:n].sqrt()

    @torch.no_grad()
    def features_with_ln_norms(self, src: torch.Tensor, tgt_in: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """F(x, theta) in eval mode (no dropout), plus each sublayer's ln_input_norm on the
        same pass (over the real tokens of its stack's input)."""
        residuals = self.residuals
        tokens = self.model.token_masks(src, tgt_in)
        # Eval mode only matters with dropout; toggling every module costs more than the
        # probe's own arithmetic in a deep tiny model, so skip it when nothing would change.
        toggle = self.model.training and getattr(self.model.config, "dropout", 0) > 0
        if toggle:
            self.model.eval()
        for res, stack in zip(residuals, self.stacks):
            res.record_ln_input = True
            res.ln_input_mask = tokens.get(stack)
        try:
            feats = self.model.features(src, tgt_in)
            # NaN (an empty cell) where a placement has no norm on the stream (ReZero, Fixup, T-Fixup).
            nan = feats.new_full((), float("nan"))
            ln_norms = (torch.stack([res.ln_input_norm if res.ln_input_norm is not None else nan
                                     for res in residuals]) if residuals else feats.new_zeros(0))
        finally:
            for res in residuals:
                res.record_ln_input = False
                res.ln_input_norm = res.ln_input_mask = None
            if toggle:
                self.model.train()
        return feats, ln_norms


def rows_for_layers(step: int, keys, grad_norms: List[float], ln_norms: List[float]) -> List[Dict]:
    """Tidy rows of layers.csv: one per (step, stack, layer, sublayer). A sublayer without a
    norm on its stream gets an empty ln_input_norm cell."""
    return [
        {"step": step, "stack": stack, "layer": layer, "sublayer": name,
         "grad_norm": g, "ln_input_norm": n if n == n else None}
        for (stack, layer, name), g, n in zip(keys, grad_norms, ln_norms)
    ]
