"""One run on K processes (data parallel), on PyTorch's own engine: a process group started by
torchrun (or srun with K tasks), DistributedDataParallel or FSDP2's `fully_shard`, and
torch.distributed.checkpoint (train/checkpoint.py). docs/scale.md has the commands.

What stays the same as in one process, and how:
- Every rank draws the *global* batch from the same seeded stream and trains on its share of
  its rows (`share`): the batch, and every batch after it, is the one-process run's. The loss
  of a share is its summed token loss over the global count of predicted tokens, times K (DDP
  and FSDP2 average the gradients over K ranks), so the gradient is the one-process gradient.
- Every rank is seeded alike and builds and initialises the same model (under FSDP each layer
  sharded as it is built, `build_sharded`); the probes run on the whole fixed probe batch on
  every rank (under FSDP layer by layer through FSDP's own all-gather, `layer_by_layer`), and
  what they read of the weights and gradients combines over the shards as each probe declares
  (the probes' `combine`: `sum_`, `max_`, `gather`). Evaluation and decoding, whose forwards
  differ between ranks, run on the whole gathered model (`full_weights`).
- Only rank 0 writes files (train/files.py's writers do nothing on the other ranks) and
  holds the run's lock; decisions about the folder and about divergence are taken from
  values every rank has (`broadcast`, an all-reduced loss), so no rank waits in a collective
  the others skip.

This module is the only one that forms process groups and calls collectives on tensors
(train/checkpoint.py uses torch.distributed.checkpoint; plan.py forms a group of the "fake"
backend, whose collectives do nothing; a probe gathers a DTensor through its own methods).
"""

from __future__ import annotations

import datetime
import os
from contextlib import contextmanager
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from stabexp.errors import ConfigError

# How long a collective may wait for the other ranks before the run fails: a rank that died
# or hangs ends the others instead of leaving them blocked (env STABEXP_DIST_TIMEOUT_S).
TIMEOUT_S = 600


def launched() -> bool:
    """Whether this process was started as one of a process group: by torchrun (WORLD_SIZE,
    even 1), as one of K > 1 tasks of a submitit job (Hydra's submitit launchers with
    tasks_per_node, on SLURM or locally), or as one of K > 1 tasks of the current srun step
    (SLURM_STEP_NUM_TASKS, not the job's SLURM_NTASKS: a lone `python` inside a K-task batch
    script is one process)."""
    if "WORLD_SIZE" in os.environ:
        return True
    if int(os.environ.get("SUBMITIT_LOCAL_NTASKS", "1")) > 1:
        return True
    return "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1


def launched_world() -> int:
    """The number of processes the launcher started (before the process group forms)."""
    for key in ("WORLD_SIZE", "SUBMITIT_LOCAL_NTASKS", "SLURM_STEP_NUM_TASKS"):
        if key in os.environ:
            return int(os.environ[key])
    return 1


def _launcher_env() -> None:
    """torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, ...) from submitit's or srun's."""
    if "WORLD_SIZE" in os.environ:
        return
    try:
        from submitit.helpers import TorchDistributedEnvironment

        # Not CUDA_VISIBLE_DEVICES: every rank keeps seeing the node's GPUs and picks LOCAL_RANK's.
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        return
    except ImportError:
        pass
    import subprocess

    host = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                          capture_output=True, text=True, check=True).stdout.split()[0]
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(20000 + int(os.environ["SLURM_JOB_ID"]) % 20000),
                      RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_STEP_NUM_TASKS"],
                      LOCAL_RANK=os.environ["SLURM_LOCALID"])


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def launcher_rank() -> int:
    """This process's rank as its launcher numbered it, before any process group exists."""
    for key in ("RANK", "SUBMITIT_LOCAL_GLOBALID", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def setup(init_method: Optional[str] = None, rank: Optional[int] = None, world_size: Optional[int] = None) -> None:
    """Join the process group (once): gloo for CPU tensors and, where CUDA is, nccl for CUDA
    tensors on LOCAL_RANK's GPU, so the model's device (train.device) picks the backend.
    Without arguments from torchrun's (or srun's, or submitit's) environment; tests pass a
    file:// init_method, rank and world size."""
    if dist.is_initialized():
        return
    timeout = datetime.timedelta(seconds=float(os.environ.get("STABEXP_DIST_TIMEOUT_S", TIMEOUT_S)))
    if init_method is None:
        _launcher_env()
    backend = "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank())
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, init_method=init_method, timeout=timeout,
                            rank=-1 if rank is None else rank, world_size=-1 if world_size is None else world_size)


def teardown() -> None:
    _MESHES.clear()  # of the group destroyed here
    if dist.is_initialized():
        dist.destroy_process_group()


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if active() else 0


def world() -> int:
    return dist.get_world_size() if active() else 1


def is_rank0() -> bool:
    return rank() == 0


def barrier() -> None:
    if world() > 1:
        dist.barrier()


def broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (the others' argument is ignored)."""
    if world() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj: Any) -> List[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if world() == 1:
        return [obj]
    out: List[Any] = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def _all_reduce(t: torch.Tensor, op) -> torch.Tensor:
    """All ranks' `t` reduced by `op`, on every rank (one collective; `t` itself when alone)."""
    if world() == 1:
        return t
    out = t.detach().clone()
    dist.all_reduce(out, op=op)
    return out


def agreed_signal(received: Optional[int]) -> Optional[int]:
    """The signal to stop on after this step: this process's; on K processes the one any rank
    got, agreed after every step (a CPU tensor, through gloo: no wait for a GPU), so that every
    rank checkpoints at the same step, well within torchrun's 30 s before it kills."""
    if world() == 1:
        return received
    return int(max_(torch.tensor([received or 0])).item()) or None


def sum_(t: torch.Tensor) -> torch.Tensor:
    return _all_reduce(t, dist.ReduceOp.SUM)


def max_(t: torch.Tensor) -> torch.Tensor:
    return _all_reduce(t, dist.ReduceOp.MAX)


# --- each rank's share --------------------------------------------------------------------

def rows(batch: Tuple[torch.Tensor, ...]) -> Tuple[torch.Tensor, ...]:
    """This rank's rows of a batch: K contiguous slices as equal as the rows allow (a
    token-budget batch need not divide by K); empty when the batch has fewer rows than ranks."""
    k, r = world(), rank()
    if k == 1:
        return batch
    n = batch[1].shape[0]  # tgt_in: every task's batch has target rows (an LM's src is (B, 0))
    return tuple(t[n * r // k:n * (r + 1) // k] for t in batch)


def share(batch: Tuple[torch.Tensor, ...]) -> Tuple[Tuple[torch.Tensor, ...], float]:
    """(this rank's rows of a training batch, its weight): a rank whose rows would be empty
    still runs the step, on the batch's first row with weight 0, so that every rank takes part
    in the gradient reduction."""
    part = rows(batch)
    if part[1].shape[0] == 0:
        return tuple(t[:1] for t in batch), 0.0
    return part, 1.0


def share_of(items: Sequence) -> List:
    """This rank's items of a list (every K-th from its rank): eval batches, sentences to decode."""
    return list(items[rank()::world()])


def in_order(parts: List[List], total: int) -> List:
    """The lists `share_of` dealt to the ranks (gathered, in rank order) back in the original order."""
    out: List = [None] * total
    for r, part in enumerate(parts):
        out[r::len(parts)] = part
    return out


# --- wrapping the model -------------------------------------------------------------------

def check_shardable(model: nn.Module) -> None:
    """FSDP2's fully_shard refuses 0-dim parameters (it wants shape (1,)): name the first."""
    scalars = [name for name, p in model.named_parameters() if p.dim() == 0]
    if scalars:
        raise ConfigError(f"train.parallel=fsdp: parameter {scalars[0]} is a 0-dim scalar, which fully_shard "
                          "cannot shard (give it shape (1,) in the model, or use train.parallel=ddp)")


def _fsdp():
    """FSDP2's fully_shard and FSDPModule (public from torch 2.6; the SUM reduction this module
    relies on from 2.8)."""
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard
    except ImportError:
        FSDPModule = fully_shard = None
    if not hasattr(FSDPModule, "set_force_sum_reduction_for_comms"):
        raise ConfigError(f"train.parallel=fsdp needs torch 2.8 or later (this is {torch.__version__}): "
                          "use train.parallel=ddp")
    return FSDPModule, fully_shard


_MESHES: dict = {}


def device_mesh(device: torch.device):
    """The one-dimensional mesh of the K ranks FSDP2 shards over, made once per device type
    (`stabexp plan` makes it before it enters FakeTensorMode, where a mesh cannot be made)."""
    from torch.distributed.device_mesh import init_device_mesh

    key = (device.type, world())
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device.type, (world(),))
    return _MESHES[key]


def _shard(module: nn.Module, bf16: bool, device: torch.device) -> None:
    """fully_shard one module in place. bf16: FSDP2's mixed precision, parameters gathered in
    bf16 for the forward and backward, gradients reduced in fp32 into the fp32 shards, which the
    optimiser updates (its master weights)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    FSDPModule, fully_shard = _fsdp()
    check_shardable(module)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    fully_shard(module, mesh=device_mesh(device), mp_policy=policy)
    # The reduction is a SUM followed by the division by K, not the reduce-scatter with AVG,
    # which gloo has been seen to do as a SUM (pytorch/pytorch#162338); the parity tests
    # (tests/test_distributed.py) check the result either way.
    module.set_force_sum_reduction_for_comms(True)


def build_sharded(build: Callable[[], nn.Module], is_layer: Callable[[nn.Module], bool], device: torch.device,
                  bf16: bool = False) -> nn.Module:
    """FSDP2 without any rank holding the whole model: `build()` runs as it would for one
    process, and each layer (`is_layer`) is moved to `device` and fully_shard-ed the moment it
    is built (a module-registration hook), before the next layer exists; then the root. So the
    constructor draws from the random stream exactly as the unsharded build does, and a rank
    holds one whole layer at most, beside its shards of the others. Then the init rule runs
    on the shards (`whole_draws`)."""
    def shard_layer(parent: nn.Module, name: str, module: nn.Module):
        if is_layer(module) and not is_sharded(module):
            _shard(on_device(module, device), bf16, device)
        return None

    handle = nn.modules.module.register_module_module_registration_hook(shard_layer)
    try:
        model = build()
    finally:
        handle.remove()
    _shard(on_device(model, device), bf16, device)
    return model


def on_device(module: nn.Module, device: torch.device) -> nn.Module:
    # Moved only where it is not there already: `stabexp plan` builds under FakeTensorMode,
    # whose tensors Module.to cannot swap in place.
    if any(t.device != device for t in [*module.parameters(), *module.buffers()]):
        module.to(device)
    return module


def wrap(model: nn.Module, parallel: str, device: torch.device) -> nn.Module:
    """The module the training step calls: DDP around the model, or under FSDP the model
    itself, sharded by `build_sharded` (or here, every layer and then the root, when it was
    built whole: FSDP2 turns the model into an FSDPModule in place, its parameters DTensor
    shards)."""
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        import inspect

        # The model's buffers (sinusoidal positions) are constants: nothing to sync per step.
        # torch 2.13 renamed the switch (broadcast_buffers warns there); older torch has only the old name.
        no_sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                   else "broadcast_buffers")
        # Gradients as views into DDP's buckets: no second copy of them (the same numbers), and
        # a rank's memory is the one-process model's on its share (what `stabexp plan` counts).
        return DistributedDataParallel(model, device_ids=[local_rank()] if device.type == "cuda" else None,
                                       gradient_as_bucket_view=True, **{no_sync: False})
    if parallel == "fsdp" and not is_sharded(model):
        check_shardable(model)
        for stack in (getattr(model, "encoder", ()), getattr(model, "decoder", ())):
            for layer in stack:
                _shard(layer, False, device)
        _shard(model, False, device)
    return model


# Tensor methods that fill a tensor with random numbers: each draws numel() numbers, in order.
_RANDOM_FILLS = {"normal_", "uniform_", "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_",
                 "random_"}


@contextmanager
def whole_draws(model: nn.Module):
    """For the init rule of a sharded `model`: each nn.init function and each random fill
    (normal_, uniform_, ...) called on a sharded parameter runs on the whole tensor, as the
    unsharded init does (nn.init's from its current values, gathered), and every rank keeps its
    shard of the result: the shards of the unsharded init for the same seed, the random stream
    advancing as it would. A slice of a parameter (W_Q, W_K, W_V of a fused projection) is a
    view of the parameter gathered whole, written back to the shards before any other call
    reads or writes a parameter. A rank holds one layer's fused parameters whole at most, never
    the model. Every parameter is sharded again at the end (a rule's forward, Admin's
    profiling, leaves the root's gathered)."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.overrides import TorchFunctionMode

    def keep_mine(param: torch.Tensor, whole: torch.Tensor) -> None:
        # src_data_rank=None: every rank holds the same whole tensor and keeps its part.
        mine = distribute_tensor(whole.detach(), param.device_mesh, param.placements, src_data_rank=None)
        with torch.no_grad():
            param.to_local().copy_(mine.to_local())

    layers = [m for m in model.modules() if is_sharded(m) and m is not model]
    unit = {id(p): i for i, layer in enumerate(layers) for p in layer.parameters()}  # the root's: none

    class WholeDraws(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            # id(parameter) -> [parameter, its whole copy, written since its last write-back]
            self.gathered: dict = {}

        def slice_of(self, a) -> Optional[list]:
            if not isinstance(a, torch.Tensor) or isinstance(a, DTensor) or a.device.type == "meta":
                return None
            try:
                ptr = a.untyped_storage().data_ptr()
            except RuntimeError:  # a tensor without storage of its own (a functional wrapper)
                return None
            return next((e for e in self.gathered.values() if e[1].untyped_storage().data_ptr() == ptr), None)

        def write_back(self, drop=lambda key: False) -> None:
            for key in list(self.gathered):
                entry = self.gathered[key]
                if entry[2]:
                    keep_mine(entry[0], entry[1])
                    entry[2] = False
                if drop(key):
                    del self.gathered[key]

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            first = args[0] if args else kwargs.get("tensor")
            name = getattr(func, "__name__", "")
            if name == "__getitem__" and isinstance(first, DTensor) and isinstance(first, nn.Parameter):
                key = id(first)
                # Another layer's parameter: the gathered ones are done with (one layer at a time).
                self.write_back(drop=lambda k: unit.get(k) != unit.get(key))
                if key not in self.gathered:
                    # clone: full_tensor may return an async collective's wrapper, not storage to write to
                    self.gathered[key] = [first, first.full_tensor().clone(), False]
                return self.gathered[key][1][args[1]]
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            slices = [e for e in map(self.slice_of, tensors) if e is not None] if self.gathered else []
            if slices:  # a call on a slice of a gathered parameter
                for entry in slices:
                    entry[2] = True
                return func(*args, **kwargs)
            if tensors:  # the shards are read or written: they are brought up to date first
                direct = {id(a) for a in tensors if isinstance(a, DTensor)}
                self.write_back(drop=lambda k: k in direct)  # a slice of it taken before is stale now
            is_init = getattr(func, "__module__", None) == "torch.nn.init"
            if not isinstance(first, DTensor) or not (is_init or name in _RANDOM_FILLS):
                return func(*args, **kwargs)
            whole = first.full_tensor().clone() if is_init else torch.empty(first.shape, dtype=first.dtype,
                                                                           device=first.to_local().device)
            if args:
                func(whole, *args[1:], **kwargs)
            else:
                func(**{**kwargs, "tensor": whole})
            keep_mine(first, whole)
            return first

    mode = WholeDraws()
    with mode:
        yield
        mode.write_back(drop=lambda key: True)
    for module in model.modules():
        if is_sharded(module):
            module.reshard()


def is_sharded(model: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


@contextmanager
def full_weights(model: nn.Module):
    """Under FSDP, the model with every parameter gathered whole, for passes that are not the
    training step (probes, evaluation, decoding): ranks may then run different forwards, and
    methods other than `forward`, with no FSDP collective inside (the block's own reductions,
    such as the eval's sums, are its business). Elsewhere a no-op."""
    if not is_sharded(model):
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    # FSDP2 takes the first module to run forward as its root; a probe may call a layer first
    # (or a method other than forward), so the model is made the root here. Private API: no
    # public one in torch 2.13.
    model._get_fsdp_state()._lazy_init()
    # The layers reshard after their forward (fully_shard's default), the root does not (FSDP2's
    # own choice for the root): only the layers' setting is switched off for the block and back.
    layers = [m for m in model.modules() if isinstance(m, FSDPModule) and m is not model]
    for m in [model, *layers]:
        m.unshard()
    for m in layers:
        m.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for m in layers:
            m.set_reshard_after_forward(True, recurse=False)
        for m in [model, *layers]:
            m.reshard()


@contextmanager
def layer_by_layer(model: nn.Module):
    """Under FSDP, the probe passes: the root's own parameters (embeddings, final norm) gathered
    for the block, each layer's by FSDP's own all-gather as that layer runs and freed after it,
    so no rank holds more than the root and one layer. Every rank runs the same passes on the
    same probe batch (the collectives match), and they call layers only through their forward.
    Elsewhere a no-op."""
    if not is_sharded(model):
        yield
        return
    model._get_fsdp_state()._lazy_init()  # the model as FSDP's root (see full_weights)
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


@contextmanager
def accumulating(train_model: nn.Module, last: bool):
    """Around the forward and backward of one batch of an optimiser step of several
    (train.update_freq): under DDP the gradient all-reduce is skipped for every batch but the
    last (DDP's `no_sync`), whose backward reduces the sum of them all. FSDP2 reduce-scatters
    every batch's gradients into the sharded ones, which add up there: keeping whole gradients
    between batches (`set_requires_gradient_sync(False)`) would undo the sharding's memory
    saving. Elsewhere a no-op."""
    from torch.nn.parallel import DistributedDataParallel

    module = getattr(train_model, "_orig_mod", train_model)  # torch.compile's wrapper
    if last or not isinstance(module, DistributedDataParallel):
        yield
        return
    with module.no_sync():
        yield


def regather_root(model: nn.Module) -> None:
    """Inside `layer_by_layer`, after a backward pass (which reshards FSDP's root at its end):
    the root's parameters gathered again for the passes that follow. Elsewhere a no-op."""
    if is_sharded(model):
        model.unshard()


def sharded_like(shard: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`shard`, this rank's part of a tensor split as the DTensor `like` is, as a DTensor (its
    storage shared): `.full_tensor()` gathers the whole, DCP saves each rank's part."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(shard, like.device_mesh, like.placements, shape=like.shape, stride=like.stride())


def local_part(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's part of `whole`, split as the DTensor `like` is (FSDP2: by rows); all of it
    when `like` is a plain tensor. Every rank holds `whole` alike: nothing is sent."""
    if not hasattr(like, "device_mesh"):
        return whole
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(whole, like.device_mesh, like.placements, src_data_rank=None).to_local()


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (a plain tensor unchanged)."""
    return t.to_local() if hasattr(t, "to_local") else t
