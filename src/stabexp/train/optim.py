"""The optimiser of a run (conf/optim/*.yaml), with weight decay on the matrices only by default.

- adam: Adam with coupled L2 decay (PyTorch's Adam weight_decay adds lambda*w to the gradient);
- adamw: decoupled decay, w <- (1 - lr*lambda) w (Loshchilov & Hutter 2019);
- adamw_independent: decay independent of the peak lr, w <- (1 - lambda * lr_t / lr_max) w
  (Wortsman et al. 2023, Sec. 3.2.2: theta <- theta - eta_t u - lambda (eta_t / eta_max) theta),
  which is PyTorch's AdamW with weight_decay lambda / lr_max;
- radam: RAdam (Liu et al. 2020, arXiv 1908.03265), coupled L2 decay; the optimiser of Admin's
  (lr, beta2) grid without warm-up (Transformer-Clinic's iwslt14_de-en recipe);
- sgd: plain SGD, coupled decay; sgdm: SGD with momentum mu (PyTorch's form, no dampening);
- muon: Muon (Jordan et al. 2024; torch.optim.Muon) on the 2-D matrices of the residual
  branches, Newton-Schulz-orthogonalised Nesterov momentum, its lr matched to AdamW's update
  RMS by 0.2 sqrt(max(A, B)) (Liu et al. 2025, "Muon is Scalable for LLM Training",
  arXiv 2502.16982; adjust_lr_fn="match_rms_adamw"), decoupled decay; AdamW on every other
  parameter (embeddings, norms, biases, scalars), as Moonlight and Kimi K2 do. The fused QKV
  matrix of a self-attention is one 3d x d matrix to Muon (torch's Muon takes whole parameters).
The equilibrium each one predicts for scale-invariant weights: stabexp/theory.py.

OPTIMISERS maps each name to its factory (model, cfg, device) -> torch.optim.Optimizer. It is
the package's entry point of the stabexp.optimizers group: `optim.name` is looked up through
stabexp.plugins, which also finds the optimisers of other packages and a user's factory named by
a dotted path (`as_optimiser_factory`; docs/plugins.md). A factory may carry its own rules as
`factory.check(cfg)` (raising ConfigError), which config.validate calls.
"""

from __future__ import annotations

from typing import Callable, Dict, List

import torch
import torch.nn as nn

from stabexp import distributed, plugins
from stabexp.errors import ConfigError, need
from stabexp.theory import torch_form


def param_groups(model: nn.Module, weight_decay: float, decay_on: str) -> List[Dict]:
    """Matrices (and embeddings) decay; biases, LN parameters and Admin's omegas do not, unless
    decay_on="all". Empty groups are dropped."""
    if decay_on == "all":
        return [{"params": list(model.parameters()), "weight_decay": weight_decay}]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [g for g in ({"params": decay, "weight_decay": weight_decay},
                        {"params": rest, "weight_decay": 0.0}) if g["params"]]


class MuonAdamW(torch.optim.Optimizer):
    """Muon on `matrices`, AdamW on the other groups, stepped together as one optimiser so that
    one lr schedule and one checkpoint cover both: the two share their param-group dicts, so
    the schedule's lr reaches each."""

    def __init__(self, matrices: List[nn.Parameter], other_groups: List[Dict], lr: float, o, fast: Dict):
        self.muon = torch.optim.Muon(matrices, lr=lr, weight_decay=o.weight_decay, momentum=o.momentum,
                                     nesterov=True, adjust_lr_fn="match_rms_adamw")
        self.adamw = torch.optim.AdamW(other_groups, lr=lr, betas=tuple(o.betas), eps=o.eps, **fast)
        super().__init__(self.muon.param_groups + self.adamw.param_groups, {})

    @torch.no_grad()
    def step(self, closure=None):
        self.muon.step()
        self.adamw.step()

    def state_dict(self) -> Dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: Dict) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])
        # Loading gives each optimiser new group dicts: share them again, or the schedule's lr
        # would stop reaching the two.
        self.param_groups = self.muon.param_groups + self.adamw.param_groups


def branch_matrices(model: nn.Module) -> List[nn.Parameter]:
    """The weight matrices of every residual branch (what Muon orthogonalises): the Linear
    weights under each sublayer's `branch`, not the embeddings or DLCL's layer weights."""
    return [m.weight for *_, res in model.residuals() for m in res.branch.modules() if isinstance(m, nn.Linear)]


def _groups(model: nn.Module, cfg, name: str) -> List[Dict]:
    """The param groups of optimiser `name`, with the decay PyTorch's form of it takes."""
    weight_decay = torch_form(name, cfg.optim.weight_decay, cfg.train.lr)[1]
    return param_groups(model, weight_decay, cfg.optim.decay_on)


def _fast(device: torch.device) -> Dict:
    # One kernel for all tensors: PyTorch's default on the CPU loops over parameters in Python,
    # which dominates the step of a 100-layer tiny model.
    return {"fused": True} if device.type in ("cpu", "cuda") else {}


def _adam_like(torch_class, name: str, fused: bool = True) -> Callable[..., torch.optim.Optimizer]:
    """The factory of an Adam-family optimiser: `name`'s decay (torch_form), betas and eps."""
    def make(model: nn.Module, cfg, device: torch.device) -> torch.optim.Optimizer:
        o = cfg.optim
        speed = _fast(device) if fused else {"foreach": True}
        return torch_class(_groups(model, cfg, name), lr=cfg.train.lr, betas=tuple(o.betas), eps=o.eps, **speed)
    make.__name__ = name
    return make


adam = _adam_like(torch.optim.Adam, "adam")
adamw = _adam_like(torch.optim.AdamW, "adamw")
adamw_independent = _adam_like(torch.optim.AdamW, "adamw_independent")  # weight_decay lambda / lr_max (torch_form)
radam = _adam_like(torch.optim.RAdam, "radam", fused=False)  # torch's RAdam has no fused kernel; foreach is its fast path


def sgd(model: nn.Module, cfg, device: torch.device) -> torch.optim.Optimizer:
    return torch.optim.SGD(_groups(model, cfg, "sgd"), lr=cfg.train.lr, momentum=0.0, foreach=True)


def sgdm(model: nn.Module, cfg, device: torch.device) -> torch.optim.Optimizer:
    return torch.optim.SGD(_groups(model, cfg, "sgdm"), lr=cfg.train.lr, momentum=cfg.optim.momentum, foreach=True)


def muon(model: nn.Module, cfg, device: torch.device) -> torch.optim.Optimizer:
    matrices = branch_matrices(model)
    taken = {id(p) for p in matrices}
    rest = [{**g, "params": [p for p in g["params"] if id(p) not in taken]} for g in _groups(model, cfg, "muon")]
    return MuonAdamW(matrices, [g for g in rest if g["params"]], cfg.train.lr, cfg.optim, _fast(device))


def _check_muon(cfg) -> None:
    need(cfg.model.arch != "normmlp", "optim.name", "muon",
         "orthogonalises the residual branches' matrices, and model=normmlp has none")
    need(hasattr(torch.optim, "Muon"), "optim.name", "muon",
         f"needs torch.optim.Muon (PyTorch 2.9 or later); this torch is {torch.__version__}")
    # Muon's checkpoint is two optimisers' (MuonAdamW), which DCP does not take as one.
    need(cfg.train.parallel == "none", "optim.name", "muon",
         f"cannot be muon with train.parallel={cfg.train.parallel}: Muon runs on one process only")


muon.check = _check_muon  # config.validate calls an optimiser factory's own check


OPTIMISERS: Dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adam": adam,
    "adamw": adamw,
    "adamw_independent": adamw_independent,
    "radam": radam,
    "sgd": sgd,
    "sgdm": sgdm,
    "muon": muon,
}


def as_optimiser_factory(obj) -> Callable[..., torch.optim.Optimizer]:
    """What a name or dotted path may lead to (stabexp.plugins): a factory (model, cfg, device)
    -> torch.optim.Optimizer. The lr schedule scales each param group's lr from cfg.train.lr."""
    if not callable(obj) or isinstance(obj, type):
        raise plugins.Rejected(f"it is {plugins.what_is(obj)}, not a factory (model, cfg, device) -> "
                               "torch.optim.Optimizer")
    if not plugins.takes(obj, "model", "cfg", "device"):
        raise plugins.Rejected("it is a factory that cannot be called as factory(model, cfg, device)")
    return obj


def build_optimizer(cfg, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    optimiser = plugins.optimiser_factory(cfg.optim.name)(model, cfg, device)
    if not isinstance(optimiser, torch.optim.Optimizer):
        raise ConfigError(f"optim.name={cfg.optim.name} is not allowed: it made {plugins.what_is(optimiser)}, "
                          "not a torch.optim.Optimizer")
    return optimiser


def clip_gradients(model: nn.Module, max_norm: float, sharded: bool = False) -> None:
    """Total grad-norm clipping; under FSDP2 the norm of the sharded gradients comes from their
    local shards, summed across the ranks in one collective."""
    if not sharded:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return
    grads = [distributed.local(p.grad) for p in model.parameters() if p.grad is not None]
    total = distributed.sum_(torch.stack(torch._foreach_norm(grads)).pow(2).sum()).sqrt()
    torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp(max=1.0))
