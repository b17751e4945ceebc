"""A small normalised network for the spherical-motion-dynamics study (Wan et al. 2021; Kosson et al. 2023).

Each hidden layer is x <- ReLU(LN(W x)) with no bias and an LN without affine parameters, so the
output of every hidden W is normalised directly: scaling W by c > 0 leaves the network unchanged,
and W is exactly scale-invariant (the setting of Wan et al. 2021 and Kosson et al. 2023).
The classifier head is a plain linear layer and is not scale-invariant: it is the control.
The Transformer has no exactly scale-invariant weight (biases, residual sums), hence this model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class NormMLPConfig:
    in_dim: int = 32       # input features
    width: int = 64        # hidden width
    depth: int = 3         # hidden layers, each W -> LN -> ReLU
    classes: int = 10      # outputs


class NormMLP(nn.Module):
    def __init__(self, c: NormMLPConfig):
        super().__init__()
        self.config = c
        dims = [c.in_dim] + [c.width] * c.depth
        self.hidden = nn.ModuleList(nn.Linear(a, b, bias=False) for a, b in zip(dims[:-1], dims[1:]))
        self.head = nn.Linear(c.width, c.classes)
        for layer in self.hidden:
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")

    def features(self, x: torch.Tensor, _unused: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The last hidden representation, (B, T, width)."""
        for layer in self.hidden:
            x = F.relu(F.layer_norm(layer(x), (layer.out_features,)))
        return x

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(features)

    def forward(self, x: torch.Tensor, _unused: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.logits(self.features(x))

    def residuals(self) -> Iterator:
        return iter(())  # no residual sublayers: nothing per sublayer to report

    def token_masks(self, x: torch.Tensor, _unused: Optional[torch.Tensor] = None):
        return {}  # fixed-size inputs: no padding, no stacks

    def feature_mask(self, x: torch.Tensor, _unused: Optional[torch.Tensor] = None):
        return None

    def weight_matrices(self) -> Iterator[Tuple[str, int, str, str, nn.Parameter]]:
        """(stack, layer, sublayer, param, weight) for every weight matrix, bottom-up."""
        for i, layer in enumerate(self.hidden, start=1):
            yield "mlp", i, "hidden", "weight", layer.weight
        yield "mlp", len(self.hidden) + 1, "head", "weight", self.head.weight
