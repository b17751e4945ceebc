"""Equilibrium of scale-invariant weights under weight decay: the one place for these formulas.

Spherical motion dynamics (Wan et al. 2021, arXiv 2006.08419) and rotational equilibrium
(Kosson et al. 2023, arXiv 2305.17212; epfml/REQ); docs/methods.md, "Spherical motion
dynamics". PyTorch conventions: lr eta, weight decay
lambda as `weight_decay` (SGD adds lambda*w to the gradient; AdamW multiplies w by 1 - eta*lambda),
momentum mu, Adam's beta1.

| optimiser | angular update per step | norm                       | time constant (steps) |
|-----------|-------------------------|----------------------------|-----------------------|
| sgd       | sqrt(2 eta lambda)      | (eta L / (2 lambda))^(1/4) | 1 / (4 eta lambda)    |
| sgdm      | sqrt(2 eta lambda/(1+mu)) | (eta L/(2 lambda (1-mu)))^(1/4) | (1 - mu)/(4 eta lambda) |
| adamw     | sqrt(2 eta lambda (1-beta1)/(1+beta1)) | sqrt(eta C / (2 lambda)) | 1 / (2 eta lambda) |
| adam (L2) | none: depends on the gradients, not on the hyper-parameters alone |

L = E||g~||^2, the expected squared gradient norm of the weight rescaled to unit norm; C = the
number of elements of the weight.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

OPTIMISERS = ("sgd", "sgdm", "adamw", "adam")


def torch_form(name: str, weight_decay: float, lr: float) -> Tuple[str, float]:
    """The PyTorch optimiser and weight_decay that run optim.name `name` with decay
    `weight_decay` at peak lr `lr` (what the formulas here take): adamw_independent's decay,
    independent of the peak lr (Wortsman et al. 2023, Sec. 3.2.2), is AdamW's lambda / lr_max."""
    if name == "adamw_independent":
        return "adamw", weight_decay / lr
    return name, weight_decay


def _check(optimiser: str, lr: float, weight_decay: float) -> None:
    if optimiser not in OPTIMISERS:
        raise ValueError(f"optimiser {optimiser!r}: one of {', '.join(OPTIMISERS)}")
    if lr <= 0 or weight_decay < 0:
        raise ValueError(f"lr={lr}, weight_decay={weight_decay}: need lr > 0, weight_decay >= 0")


def angular_update(optimiser: str, lr: float, weight_decay: float, momentum: float = 0.0,
                   beta1: float = 0.9) -> Optional[float]:
    """Equilibrium angular update per step (radians); None where there is no such equilibrium
    (Adam with coupled L2 decay, or no weight decay at all)."""
    _check(optimiser, lr, weight_decay)
    if optimiser == "adam" or weight_decay == 0:
        return None
    if optimiser == "sgd":
        return math.sqrt(2 * lr * weight_decay)
    if optimiser == "sgdm":
        return math.sqrt(2 * lr * weight_decay / (1 + momentum))
    return math.sqrt(2 * lr * weight_decay * (1 - beta1) / (1 + beta1))


def equilibrium_norm(optimiser: str, lr: float, weight_decay: float, momentum: float = 0.0,
                     grad_sq_at_unit_norm: Optional[float] = None,
                     elements: Optional[int] = None) -> Optional[float]:
    """Equilibrium weight norm; SGD and SGDM need L = E||g~||^2 at unit norm, AdamW the number of
    elements C. None where it is not defined or the needed quantity is not given."""
    _check(optimiser, lr, weight_decay)
    if optimiser == "adam" or weight_decay == 0:
        return None
    if optimiser in ("sgd", "sgdm"):
        if grad_sq_at_unit_norm is None:
            return None
        mu = momentum if optimiser == "sgdm" else 0.0
        return (lr * grad_sq_at_unit_norm / (2 * weight_decay * (1 - mu))) ** 0.25
    if elements is None:
        return None
    return math.sqrt(lr * elements / (2 * weight_decay))


def time_constant(optimiser: str, lr: float, weight_decay: float, momentum: float = 0.0) -> Optional[float]:
    """Steps for the distance to equilibrium to shrink by e (the linear rate's inverse)."""
    _check(optimiser, lr, weight_decay)
    if optimiser == "adam" or weight_decay == 0:
        return None
    if optimiser == "sgd":
        return 1 / (4 * lr * weight_decay)
    if optimiser == "sgdm":
        return (1 - momentum) / (4 * lr * weight_decay)
    return 1 / (2 * lr * weight_decay)


def effective_lr(optimiser: str, lr: float, norm: float) -> float:
    """The step size a scale-invariant weight of norm ||w|| feels, per optimiser.

    SGD / SGDM: the gradient of a scale-invariant weight is g = g~ / ||w|| (g~ at unit norm), so a
    step turns w by about eta ||g~|| / ||w||^2: eta / ||w||^2 (van Laarhoven 2017; Hoffer et al.
    2018). Adam / AdamW: the update m / sqrt(v) has a size of about one per element whatever the
    gradient's scale, so a step turns w by about eta sqrt(C) / ||w||: eta / ||w|| (Kosson et al.
    2023)."""
    if optimiser not in OPTIMISERS:
        raise ValueError(f"optimiser {optimiser!r}: one of {', '.join(OPTIMISERS)}")
    if norm == 0:  # a weight at zero (Fixup's W_O and W_2 at init) has no direction to turn
        return float("nan")
    return lr / norm ** 2 if optimiser in ("sgd", "sgdm") else lr / norm


def equilibrium(optimiser: str, lr: float, weight_decay: float, momentum: float = 0.0,
                beta1: float = 0.9) -> Dict[str, Optional[float]]:
    """The hyper-parameter-only values, for a run's summary."""
    return {"optimiser": optimiser, "lr": lr, "weight_decay": weight_decay,
            "angular_update": angular_update(optimiser, lr, weight_decay, momentum, beta1),
            "time_constant": time_constant(optimiser, lr, weight_decay, momentum),
            "citation": "Wan et al. 2021 (Spherical Motion Dynamics); Kosson et al. 2023 (Rotational Equilibrium)"}
