"""The optimiser of a run (conf/optim/*.yaml), with weight decay on the matrices only by default.

- adam: Adam with coupled L2 decay (PyTorch's Adam weight_decay adds lambda*w to the gradient);
- adamw: decoupled decay, w <- (1 - lr*lambda) w (Loshchilov & Hutter 2019);
- sgd: plain SGD, coupled decay; sgdm: SGD with momentum mu (PyTorch's form, no dampening).
The equilibrium each one predicts for scale-invariant weights: stabexp/theory.py.
"""

from __future__ import annotations

from typing import Dict, List

import torch
import torch.nn as nn

OPTIMISERS = ("adam", "adamw", "sgd", "sgdm")
DECAY_ON = ("matrices", "all")


def param_groups(model: nn.Module, weight_decay: float, decay_on: str) -> List[Dict]:
    """Matrices (and embeddings) decay; biases, LN parameters and Admin's omegas do not, unless
    decay_on="all". Empty groups are dropped."""
    if decay_on == "all":
        return [{"params": list(model.parameters()), "weight_decay": weight_decay}]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [g for g in ({"params": decay, "weight_decay": weight_decay},
                        {"params": rest, "weight_decay": 0.0}) if g["params"]]


def build_optimizer(cfg, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    o, lr = cfg.optim, cfg.train.lr
    groups = param_groups(model, o.weight_decay, o.decay_on)
    # One kernel for all tensors: PyTorch's default on the CPU loops over parameters in Python,
    # which dominates the step of a 100-layer tiny model.
    fast = {"fused": True} if device.type in ("cpu", "cuda") else {}
    if o.name == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=tuple(o.betas), eps=o.eps, **fast)
    if o.name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=tuple(o.betas), eps=o.eps, **fast)
    if o.name in ("sgd", "sgdm"):
        return torch.optim.SGD(groups, lr=lr, momentum=o.momentum if o.name == "sgdm" else 0.0,
                               foreach=True)
    raise ValueError(f"optim.name={o.name}: one of {', '.join(OPTIMISERS)}")
