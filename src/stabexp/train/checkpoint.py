"""A run's checkpoint: everything a resumed run needs to continue as if it had never stopped.

Written at the end of a step (every train.checkpoint_every steps, and when the process is asked
to stop: SIGTERM, SIGINT, SIGUSR1), atomically, to run_folder/checkpoint.pt. It holds the model,
the optimiser, the lr schedule, every random stream (torch's global generator, which drives
dropout; the task's data streams; CUDA's generators), the probes' state (F(x, theta_0), the
weight snapshots, which weights are scale-invariant), the run's counters and results so far,
the summary written at start, and where each CSV stood. On the CPU a resumed run writes the
same files, bit for bit, as one that never stopped (tests/test_resume.py), the wall-clock
columns (elapsed_s, wall_seconds, ...) aside. It is deleted when the run finishes.

A run on K processes (stabexp.distributed) checkpoints into run_folder/checkpoint/ instead:
the model and optimiser through torch.distributed.checkpoint (`model_and_optim/`: every rank
writes its shards under FSDP; replicated DDP tensors once), and the rest in `state.pt`,
written by rank 0 with every rank's random streams. The folder is written as `checkpoint.tmp/`
and renamed into place (the previous one kept as `checkpoint.old/` until then), so a kill
leaves a whole checkpoint; it resumes on the same number of processes only.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Dict, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from stabexp import distributed
from stabexp.config import resolved
from stabexp.errors import ConfigError
from stabexp.atomic import sync_folder, write_atomic

CHECKPOINT = "checkpoint.pt"
SHARDED = "checkpoint"  # K processes: a folder (model_and_optim/ by DCP, state.pt)
FORMAT = 1  # bumped when what a checkpoint holds changes


def rng_state() -> Dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def config_text(cfg: DictConfig) -> str:
    """The config a checkpoint belongs to; `overwrite` says what to do with a folder, and
    `logger` where a run is watched, not what runs in it (a tracker may join on resume)."""
    return OmegaConf.to_yaml(OmegaConf.create(resolved(cfg, leave_out=("overwrite", "logger"))))


def save(out_dir: Path, state: Dict, model=None, optimizer=None) -> None:
    """One process: `state` (model and optimiser included) into checkpoint.pt. K processes
    (every rank calls it): `model` and `optimizer` by DCP, `state` with each rank's random
    streams by rank 0."""
    if not distributed.active():
        write_atomic(Path(out_dir) / CHECKPOINT, lambda f: torch.save({"format": FORMAT, **state}, f))
        return
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    out_dir = Path(out_dir)
    tmp, final, old = out_dir / f"{SHARDED}.tmp", out_dir / SHARDED, out_dir / f"{SHARDED}.old"
    rngs = distributed.gather(state.pop("rng"))
    if distributed.is_rank0():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    distributed.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp / "model_and_optim")
    if distributed.is_rank0():
        meta = {"format": FORMAT, "world_size": distributed.world(), "rng": rngs, **state}
        write_atomic(tmp / "state.pt", lambda f: torch.save(meta, f))
        if old.exists():  # left by a kill between the renames below; `final` is whole then
            shutil.rmtree(old)
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        sync_folder(out_dir)
    distributed.barrier()


def load_model_and_optimizer(state: Dict, model, optimizer) -> None:
    """K processes: the model's and optimiser's tensors of a sharded checkpoint (`load`'s
    state) into them, each rank its own shards."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)  # templates, filled in place
    tensors = {"model": model_state, "optim": optim_state}
    dcp.load(tensors, checkpoint_id=state["sharded"] / "model_and_optim")
    set_state_dict(model, optimizer, model_state_dict=tensors["model"], optim_state_dict=tensors["optim"])


def _sharded_path(out_dir: Path) -> Optional[Path]:
    """The sharded checkpoint folder, or the previous one when a kill fell between the renames."""
    for name in (SHARDED, f"{SHARDED}.old"):
        if (Path(out_dir) / name / "state.pt").exists():
            return Path(out_dir) / name
    return None


def load(out_dir: Path, cfg: DictConfig) -> Optional[Dict]:
    """The folder's checkpoint, or None when it has none; a checkpoint of another config is an
    error (the folder name comes from the overrides, so this means the configs changed), as is
    one written by another number of processes than this run's."""
    # What the folder holds is read by rank 0 and taken by every rank, so that all of them
    # resume (or all start) even where their views of a shared folder lag.
    path, world, grouped = Path(out_dir) / CHECKPOINT, distributed.world(), distributed.active()
    sharded = distributed.broadcast(_sharded_path(out_dir) if distributed.is_rank0() else None)
    if sharded is not None and not grouped and not path.exists():
        written = torch.load(sharded / "state.pt", map_location="cpu", weights_only=False).get("world_size")
        raise ConfigError(f"{sharded} was written by {written} processes: resume it with "
                          f"torchrun --nproc-per-node={written} -m stabexp run ... (or overwrite=true)")
    if grouped:
        if path.exists() and sharded is None:
            raise ConfigError(f"{path} was written outside a process group: resume it with stabexp run ..., "
                              "not torchrun (or overwrite=true)")
        if sharded is None:
            return None
        path = sharded / "state.pt"
    if not path.exists():
        return None
    # Our own file: optimiser states and RNG states are not plain tensors.
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("format") != FORMAT:
        raise ConfigError(f"{path} was written by another version of stabexp (format "
                           f"{state.get('format')}, this one reads {FORMAT}): run with overwrite=true")
    if state["config"] != config_text(cfg):
        raise ConfigError(f"{path} belongs to another config than this run's (the config files changed "
                           "since it was written): run with overwrite=true to start over")
    if grouped:
        if state["world_size"] != world:
            raise ConfigError(f"{sharded} was written by {state['world_size']} processes, this run has {world}: "
                              f"resume it with torchrun --nproc-per-node={state['world_size']} (or overwrite=true)")
        state.update(rng=state["rng"][distributed.rank()], sharded=sharded)
    return state


def remove(out_dir: Path) -> None:
    if not distributed.is_rank0():
        return
    for name in (SHARDED, f"{SHARDED}.tmp", f"{SHARDED}.old"):
        shutil.rmtree(Path(out_dir) / name, ignore_errors=True)
    (Path(out_dir) / CHECKPOINT).unlink(missing_ok=True)
    for partial in Path(out_dir).glob(f".{CHECKPOINT}.*.part"):  # left by a process killed mid-write
        partial.unlink(missing_ok=True)
