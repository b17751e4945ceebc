"""`stabexp plan OVERRIDES [--world K] [--gpu-memory GB] [--gpu NAME] [--mfu F] [--json]`: what
one run of `stabexp run OVERRIDES` needs per rank on K processes, found on a laptop
(docs/scale.md, "Planning a run").

The run's own model, optimiser and probes are built as `stabexp run` builds them (train/build.py,
train/optim.py), under torch's FakeTensorMode (tensors with a shape and no storage) on a process
group of K ranks of torch.distributed's "fake" backend (every collective returns at once). Nothing
is allocated and nothing is trained. Two training steps run (the second is the steady state, with
the optimiser's state) and one probe step, with torch's own FSDPMemTracker (FSDP2) or MemTracker
(one process, DDP) counting every tensor by kind, and FlopCounterMode the FLOPs of a step. The
numbers are rank 0's; FSDP2's shards differ between ranks by one row's padding at most.

What a fake pass cannot do, and what the plan does instead:
- DDP's reducer reads tensor data in C++: the rank's model runs unwrapped on its share of the
  batch. DDP keeps the gradients as views into its buckets (`distributed.wrap`), so that is its
  memory, all-reduce aside.
- A probe reads its numbers back to the host at the end of its pass, where a fake tensor has no
  value: its pass is traced up to that read. The init rule is not run (values, not memory; under
  FSDP2 it holds one whole parameter at a time, `distributed.whole_draws`).
- Evaluation under FSDP2 runs layer by layer where every rank scores the same batch (the
  synthetic tasks), else on the whole gathered model (ranks score batches of their own): that
  gather is traced on its own and printed as the eval step's memory.
- A deep model is slow to trace: above TRACE_DEPTH layers the plan traces three depths and
  extrapolates every figure linearly in depth, and says so; the parameter count, a polynomial
  of degree at most 2 in depth, is interpolated through the three exactly.
The tracker counts tensors; a GPU adds its CUDA context and the caching allocator's slack
(docs/scale.md gives the plan against measured peaks).
"""

from __future__ import annotations

import json
import math
import sys
from contextlib import nullcontext
from typing import Dict, List, Optional, Sequence

import torch
from omegaconf import DictConfig

from stabexp.errors import ConfigError
from stabexp.train.losses import training_loss

# Above this many layers per stack the plan traces TRACE_DEPTHS and extrapolates.
TRACE_DEPTH = 24
TRACE_DEPTHS = (8, 16, 24)
# Peak dense throughput (TFLOP/s) from NVIDIA's data sheets (H100 and H200: SXM): bf16 on the
# tensor cores, and fp32 on the CUDA cores (torch's fp32 matmuls while TF32 is not allowed).
GPUS = {"a100": {"bf16": 312.0, "fp32": 19.5}, "h100": {"bf16": 989.0, "fp32": 67.0},
        "h200": {"bf16": 989.0, "fp32": 67.0}}
# The rows of the table, from torch's tracker kinds (FSDPMemTracker's, then MemTracker's names).
KINDS = {"parameters": ("Sharded Param", "Unsharded Param", "Parameter"),
         "gradients": ("Sharded Grad", "Unsharded Grad", "Gradient"),
         "optimiser state": ("OptState", "Optstate"),
         "activations": ("Activation",),
         "temporaries": ("Temp", "Other"),
         "all-gather / reduce-scatter": ("All Gather", "Reduce Scatter"),
         "buffers and inputs": ("Buffer", "Inputs")}


def trace(cfg: DictConfig, world: int, fake: bool = True) -> Dict[str, float]:
    """Bytes per kind at the peak of two training steps and a probe step of rank 0 of `world`,
    the peak itself, the eval step's peak, and the FLOPs of one optimiser step of rank 0 (train.update_freq batches).
    fake=False: on real tensors (what the tracker counts on them; tests compare the two)."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils.flop_counter import FlopCounterMode

    from stabexp import distributed
    from stabexp.data import make_task
    from stabexp.probes import reference_features
    from stabexp.probes.base import REFERENCE
    from stabexp.train.build import model_for, probes_for
    from stabexp.train.optim import build_optimizer, clip_gradients

    device, t = torch.device("cpu"), cfg.train
    grouped = t.parallel != "none"
    if grouped:
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        task = make_task(cfg, device)  # real data: the batches' shapes are the run's
        torch.manual_seed(cfg.seed)
        probe_batch = task.probe_batch()[:2]
        batches = [task.train_batch(), task.train_batch()]
        sharded = t.parallel == "fsdp"
        if sharded:
            distributed.device_mesh(device)  # a mesh cannot be made under FakeTensorMode
        flops = FlopCounterMode(display=False)
        with FakeTensorMode(allow_non_fake_inputs=True) if fake else nullcontext():
            # FSDP2's model is its own training module (sharded as it is built); DDP's reducer
            # cannot run on fake tensors, so a DDP rank is the model on its share of the batch.
            model = train_model = model_for(cfg, task, device)
            opt = build_optimizer(cfg, model, device)
            for group in opt.param_groups:  # see `per_tensor`
                per_tensor(group)
            tracker = FSDPMemTracker(model, opt) if sharded else _memtracker()
            if not sharded:
                tracker.track_external(model, opt)
            autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=t.precision == "bf16")
            with tracker:
                probes = probes_for(cfg, model, task, probe_batch, device, {}, lambda: t.lr)
                for step, batch in enumerate(batches, 1):
                    backward(train_model, task, batch, opt, autocast, t.z_loss, world)
                    probes.before_step(step, step == 2)
                    if t.clip_norm > 0:
                        clip_gradients(model, t.clip_norm, sharded)
                    opt.step()
                    _next_pass(tracker)
                with distributed.layer_by_layer(model):
                    if any(REFERENCE in probe.needs for probe in probes):
                        probes.ctx.features_init = reference_features(probes.ctx.adapter, probes.ctx.probe_batch)
                    _next_pass(tracker)
                    for probe in probes:
                        try:
                            probe.measure(2)
                        except DataDependentOutputException:
                            pass  # its numbers read back to the host: the pass is done
                        _next_pass(tracker)
                peak = dict(tracker.get_tracker_snapshot("peak")[device])  # a copy: the tracker's is live
                gathered = None
                if sharded and not task.same_eval_on_every_rank:
                    with distributed.full_weights(model):
                        gathered = float(tracker.get_tracker_snapshot("current")[device]["Total"])
            # Counted apart: FlopCounterMode keeps tensors a checkpointed layer would free.
            with flops:
                backward(train_model, task, batches[1], opt, autocast, t.z_loss, world)
        parameters = sum(p.numel() for p in model.parameters())
    finally:
        if grouped:
            distributed.teardown()
    row = {kind: float(sum(peak.get(_kind(peak, name), 0) for name in names)) for kind, names in KINDS.items()}
    # An optimiser step of train.update_freq batches takes as many forwards and backwards, each
    # at the traced batch's memory (the gradients add up in place).
    row.update(peak=float(peak["Total"]), eval_peak=gathered, flops=float(flops.get_total_flops()) * t.update_freq,
               parameter_count=float(parameters))
    return row


def backward(train_model, task, batch, opt, autocast, z_loss: float, world: int) -> None:
    """A training step's forward and backward, as Run.step takes them."""
    with autocast:
        loss = training_loss(train_model, task, batch, z_loss, world)
    opt.zero_grad(set_to_none=True)
    (loss * world if world > 1 else loss).backward()


def _memtracker():
    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(MemTracker):
        """MemTracker taking a module called twice outside the root's forward (the shared
        embedding of the probe pass, model.features) as called again, not as a new iteration,
        which it refuses."""

        def _pre_fw_hook(self, module, inputs):
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                name = self._mod_tracker.get_known_fqn(module)
                if set(self._mod_tracker.parents) - {name} == {"Global"}:
                    del self.memory_tracking[module]
            super()._pre_fw_hook(module, inputs)

    return Tracker()


def per_tensor(group: Dict) -> None:
    """A param group stepped by the optimiser's loop over one tensor at a time. The fused and
    foreach kernels update in place, but under FakeTensorMode their in-place forms run as the
    functional ones, which allocate a new copy of every parameter and state: counted, that is
    four copies of the model that a GPU never holds. The loop keeps the same state and holds
    one tensor's temporaries at a time."""
    for key in ("fused", "foreach"):
        if group.get(key):
            group[key] = False


def _kind(snapshot: Dict, name: str):
    """The tracker's key whose value is `name` (its keys are enum members)."""
    return next((k for k in snapshot if getattr(k, "value", k) == name), name)


def _next_pass(tracker) -> None:
    # FSDPMemTracker keeps per-module statistics of one pass; the global peak survives this.
    if hasattr(tracker, "reset_mod_stats"):
        tracker.reset_mod_stats()


def plan(cfg: DictConfig, world: int, full_trace: bool = False) -> Dict:
    """`trace` at the run's depth, or above TRACE_DEPTH at TRACE_DEPTHS with every figure fitted
    linearly in depth and read at the run's (the parameter count interpolated exactly, below).
    Returns the figures and how they were found."""
    depth = int(cfg.depth)
    if full_trace or depth <= TRACE_DEPTH:
        return {"depth": depth, "traced": [depth], "extrapolated": False, **trace(cfg, world)}
    rows = []
    for d in TRACE_DEPTHS:
        shallow = cfg.copy()
        shallow.depth = d
        rows.append(trace(shallow, world))
    x = torch.tensor(TRACE_DEPTHS, dtype=torch.float64)
    fitted, residual = {}, 0.0
    for key in rows[0]:
        if rows[0][key] is None:
            fitted[key] = None
            continue
        y = torch.tensor([r[key] for r in rows], dtype=torch.float64)
        slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
        intercept = y.mean() - slope * x.mean()
        fitted[key] = float(intercept + slope * depth)
        if key == "peak":
            residual = float(((intercept + slope * x - y).abs() / y).max())
    # The parameter count is a polynomial of degree at most 2 in the depth (DLCL's weights over
    # the earlier layers make it quadratic, every other model linear): through the three traced
    # depths it is exact, without building the deep model (a 100,000-layer one takes minutes and
    # gigabytes even on the meta device).
    counts = [r["parameter_count"] for r in rows]
    fitted["parameter_count"] = float(round(sum(
        c * math.prod((depth - TRACE_DEPTHS[j]) / (TRACE_DEPTHS[i] - TRACE_DEPTHS[j])
                      for j in range(len(TRACE_DEPTHS)) if j != i)
        for i, c in enumerate(counts))))
    return {"depth": depth, "traced": list(TRACE_DEPTHS), "extrapolated": True, "fit_residual": residual, **fitted}


def traced_batch_bytes(cfg: DictConfig) -> int:
    """The host memory of the real batches a trace draws (two training batches of token ids, each
    its source, input and target): only the model's tensors are fake. 0 where the corpus, not
    train.batch_size, sets a batch's shape."""
    t = cfg.task
    if t.kind not in ("sort", "reverse", "lm"):
        return 0
    return 2 * 3 * 8 * cfg.train.batch_size * (t.seq_len + 1)


def seconds_per_step(flops: float, gpu: str, precision: str, mfu: float) -> float:
    """A step's FLOPs on one rank over the GPU's peak for the run's precision times `mfu`."""
    return flops / (GPUS[gpu]["bf16" if precision == "bf16" else "fp32"] * 1e12 * mfu)


GIB = 2 ** 30


def table(cfg: DictConfig, world: int, result: Dict, gpu_memory: Optional[float], gpu: str, mfu: float) -> str:
    t = cfg.train
    batch = (f"batch {t.batch_size}" if t.batch_size else
             f"batches of up to {t.max_tokens} tokens (the run's first two traced: their lengths vary)")
    if t.update_freq > 1:
        batch += f", {t.update_freq} per optimiser step (train.update_freq)"
    lines = [f"stabexp plan: {cfg.group.name}, depth {result['depth']}, d = {cfg.model.d_model}, "
             f"{world} rank(s), parallel={t.parallel}, precision={t.precision}, "
             f"activation checkpointing {'on' if t.activation_checkpointing else 'off'}, {batch}",
             f"parameters: {result['parameter_count'] / 1e6:,.1f} M; FLOPs of a training step on one rank: "
             f"{result['flops']:.3e}"]
    if result["extrapolated"]:
        lines.append(f"traced at depths {', '.join(map(str, result['traced']))} and extrapolated linearly to "
                     f"{result['depth']} (the peak's largest residual on the traced depths: "
                     f"{100 * result['fit_residual']:.2f}%)")
    unit, size = ("GiB", GIB) if result["peak"] >= GIB else ("MiB", 2 ** 20)
    lines.append(f"memory per rank at the peak of a training and a probe step ({unit}; every rank alike):")
    for kind in KINDS:
        lines.append(f"  {kind:<30}{result[kind] / size:>10.3f}")
    fits = "" if gpu_memory is None else f"   fits in {gpu_memory:g} GiB: {'yes' if result['peak'] <= gpu_memory * GIB else 'NO'}"
    lines.append(f"  {'peak':<30}{result['peak'] / size:>10.3f}{fits}")
    if result.get("eval_peak") is not None:
        lines.append(f"  {'an eval step (gathered model)':<30}{result['eval_peak'] / size:>10.3f}"
                     "   before its own activations")
    lines.append(f"time per step at {100 * mfu:g}% MFU on one {gpu.upper()} "
                 f"({GPUS[gpu]['bf16' if t.precision == 'bf16' else 'fp32']:g} TFLOP/s {t.precision}): "
                 f"{seconds_per_step(result['flops'], gpu, t.precision, mfu):.3g} s")
    lines.append("Tensors only: a GPU adds its CUDA context and the allocator's slack (docs/scale.md).")
    return "\n".join(lines)


USAGE = ("usage: stabexp plan OVERRIDES [--world K] [--gpu-memory GB] [--gpu a100|h100|h200] [--mfu F] "
         "[--full-trace] [--json]")


def main(args: Sequence[str]) -> int:
    from stabexp.compose import compose
    from stabexp.memory import available_bytes
    from stabexp.preflight import preflight

    args = list(args)
    if {"-h", "--help"} & set(args):
        print(USAGE)
        return 0
    try:
        opts = _options(args)
        world = opts["world"]
        # `stabexp run`'s checks as on `world` processes in a process group (world 1: one process).
        checked = preflight(opts["overrides"], world=(world, True))
        if checked.multirun:
            raise ConfigError("stabexp plan plans one run: drop -m and give each swept key one value")
        cfg = compose(checked.overrides)
        need, free = traced_batch_bytes(cfg), available_bytes(torch.device("cpu"))
        if need > free // 2:
            raise ConfigError(f"train.batch_size={cfg.train.batch_size} is too large to plan here: the trace draws two "
                              f"real batches of token ids ({need / 2 ** 30:,.1f} GiB) and this machine has "
                              f"{free / 2 ** 30:.1f} GiB free")
        result = plan(cfg, world, opts["full_trace"])
    except ConfigError as err:
        print(f"stabexp: error: {err}", file=sys.stderr)
        return 2
    if opts["json"]:
        print(json.dumps(result))
    else:
        print(table(cfg, world, result, opts["gpu_memory"], opts["gpu"], opts["mfu"]))
    return 0


def _options(args: List[str]) -> Dict:
    """plan's own flags out of the arguments; the rest are stabexp run's overrides."""
    opts = {"world": 1, "gpu_memory": None, "gpu": "h100", "mfu": 0.4, "json": False, "full_trace": False,
            "overrides": []}
    values = {"--world": ("world", int, "a number of processes, 1 or more"),
              "--gpu-memory": ("gpu_memory", float, "the memory of one GPU in GiB"),
              "--gpu": ("gpu", str, ", ".join(GPUS)), "--mfu": ("mfu", float, "a fraction in (0, 1]")}
    it = iter(args)
    for arg in it:
        flag, _, value = arg.partition("=")
        if flag in values:
            key, kind, allowed = values[flag]
            value = value if value else next(it, "")
            try:
                opts[key] = kind(value)
            except ValueError:
                raise ConfigError(f"{flag}={value!r} is not allowed: {allowed}") from None
            bad = ((key == "world" and opts[key] < 1) or (key == "gpu" and value not in GPUS)
                   or (key == "mfu" and not 0 < opts[key] <= 1)
                   or (key == "gpu_memory" and not (0 < opts[key] < math.inf)))
            if bad:
                raise ConfigError(f"{flag}={value} is not allowed: {allowed}")
        elif arg in ("--json", "--full-trace"):
            opts[arg[2:].replace("-", "_")] = True
        else:
            opts["overrides"].append(arg)
    return opts
