"""A run's checkpoint: everything a resumed run needs to continue as if it had never stopped.

Written at the end of a step (every train.checkpoint_every steps, and when the process is asked
to stop: SIGTERM, SIGINT, SIGUSR1; the StepHook `Checkpoints` below), atomically, to
run_folder/checkpoint.pt. It holds the model,
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
leaves a whole checkpoint (a kill after `checkpoint.tmp/` is whole and before the renames
leaves that one, which the next run puts in place); it resumes on the same number of processes
only.

Nothing in a run folder is unpickled: a checkpoint holds tensors and plain data only (numbers,
strings, lists, dicts; the random states as tensors and tuples of ints) and is read with
torch.load(weights_only=True); the sharded one's DCP metadata through an unpickler that builds
DCP's own metadata records and nothing else. A file planted in a shared outputs folder is
refused in one line, never run.
"""

from __future__ import annotations

import io
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Dict, List, Optional

import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from stabexp import distributed
from stabexp.config import resolved
from stabexp.errors import ConfigError
from stabexp.atomic import remove_partials, sync_folder, write_atomic
from stabexp.train import folder
from stabexp.train.files import MODEL
from stabexp.train.hooks import StepHook

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


class Checkpoints(StepHook):
    """When a run writes its checkpoint (Run.save_checkpoint), a StepHook on in every run: after
    every train.checkpoint_every-th step but the last (Cadence.is_checkpoint_step; a finished run
    needs none), and when the process is asked to stop (stabexp.train.stop), after the divergence
    check has read the losses left (a run that diverged ends as diverged, with no checkpoint)."""

    name = "checkpoints"

    @classmethod
    def enabled(cls, cfg) -> bool:
        return True

    @classmethod
    def from_config(cls, model, cfg) -> "Checkpoints":
        return cls()

    def after_step(self, ctx, step: int) -> None:
        if ctx.is_checkpoint_step(step):
            ctx.save_checkpoint()

    def on_stop_request(self, ctx) -> None:
        ctx.save_checkpoint()


def save(out_dir: Path, state: Dict, model=None, optimizer=None) -> None:
    """One process: `state` (model and optimiser included) into checkpoint.pt. K processes
    (every rank calls it): `model` and `optimizer` by DCP, `state` with each rank's random
    streams by rank 0."""
    if not distributed.active():
        remove_partials(Path(out_dir), CHECKPOINT)  # of processes killed mid-write
        write_atomic(Path(out_dir) / CHECKPOINT, lambda f: torch.save({"format": FORMAT, **state}, f))
        return
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    out_dir = Path(out_dir)
    tmp = out_dir / f"{SHARDED}.tmp"
    rngs = distributed.gather(state.pop("rng"))
    if distributed.is_rank0():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    distributed.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    probe_shards = sharded_probe_state(state["probes"])
    state["probes"] = {k: v for k, v in state["probes"].items() if k not in probe_shards}
    dcp.save({"model": model_state, "optim": optim_state, **_flat_probes(probe_shards)},
             checkpoint_id=tmp / "model_and_optim")
    if distributed.is_rank0():
        meta = {"format": FORMAT, "world_size": distributed.world(), "rng": rngs, **state}
        write_atomic(tmp / "state.pt", lambda f: torch.save(meta, f))
        _put_in_place(out_dir)
    distributed.barrier()


def _put_in_place(out_dir: Path) -> None:
    """A whole `checkpoint.tmp/` renamed to `checkpoint/`, the previous one kept as
    `checkpoint.old/` until then (a kill between the renames leaves it, and `checkpoint/` is
    whole then)."""
    tmp, final, old = out_dir / f"{SHARDED}.tmp", out_dir / SHARDED, out_dir / f"{SHARDED}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    sync_folder(out_dir)


def sharded_probe_state(probes: Dict) -> Dict[str, List]:
    """The entries of the probes' state that are lists of DTensors (each rank's shards of the
    update bound's theta_0 under FSDP2): saved and loaded by DCP with the model, not by rank 0."""
    from torch.distributed.tensor import DTensor

    return {k: v for k, v in probes.items()
            if isinstance(v, list) and v and all(isinstance(t, DTensor) for t in v)}


def _flat_probes(shards: Dict[str, List]) -> Dict[str, torch.Tensor]:
    return {f"probes.{key}.{i}": t for key, tensors in shards.items() for i, t in enumerate(tensors)}


def load_model_and_optimizer(state: Dict, model, optimizer, probes: Dict) -> None:
    """K processes: the model's and optimiser's tensors of a sharded checkpoint (`load`'s
    state) into them, each rank its own shards, and the probes' sharded state (`probes`: their
    state_dict now, the templates) into state["probes"]."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)  # templates, filled in place
    probe_shards = sharded_probe_state(probes)
    tensors = {"model": model_state, "optim": optim_state, **_flat_probes(probe_shards)}
    reader, planner = _dcp_classes()
    dcp.load(tensors, storage_reader=reader(state["sharded"] / "model_and_optim"), planner=planner())
    set_state_dict(model, optimizer, model_state_dict=tensors["model"], optim_state_dict=tensors["optim"])
    state["probes"].update(probe_shards)  # their tensors filled in place by dcp.load


def _sharded_path(out_dir: Path) -> Optional[Path]:
    """The sharded checkpoint folder: a whole `checkpoint.tmp/` (its state.pt is written last)
    that a kill left before the renames is put in place first; else the current one, or the
    previous one when a kill fell between the renames. Rank 0 only."""
    out_dir = Path(out_dir)
    if (out_dir / f"{SHARDED}.tmp" / "state.pt").exists():
        _put_in_place(out_dir)
    for path in (out_dir / SHARDED, out_dir / f"{SHARDED}.old"):
        if (path / "state.pt").exists():
            return path
    return None


def read(path: Path) -> Dict:
    """A file of tensors and plain data that stabexp wrote (a checkpoint, model.pt): loaded
    with weights_only=True, and anything else refused in one line (ConfigError)."""
    remedy = "delete it (a checkpoint: or run with overwrite=true)"
    if Path(path).is_file() and Path(path).stat().st_size == 0:
        raise ConfigError(f"{path} is empty (a write cut short?): it was not loaded; {remedy}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        operand = re.search(r"Unsupported operand \d+", str(err))
        if operand:  # not a pickle stream at all: bytes no writer of stabexp's made
            raise ConfigError(f"{path} is not a file stabexp wrote (its bytes are no pickle of tensors: "
                              f"{operand.group(0).lower()}): it was not loaded; {remedy}") from None
        found = re.search(r"(?:Unsupported global: GLOBAL|global) '?([\w.]+)", str(err))
        raise ConfigError(f"{path} holds objects other than tensors and plain data "
                          f"({found.group(1) if found else 'not a plain value'}), which no file stabexp writes "
                          f"does: it was not loaded; {remedy}") from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        reason = (str(err).splitlines() or [type(err).__name__])[0][:100]
        raise ConfigError(f"{path} cannot be read ({reason}): {remedy}") from None


def load(out_dir: Path, cfg: DictConfig) -> Optional[Dict]:
    """The folder's checkpoint, or None when it has none; a checkpoint of another config is an
    error naming the keys that differ (stabexp.train.folder: keys added since it was written
    count at their defaults), as is one written by another number of processes than this run's."""
    # What the folder holds is read by rank 0 and taken by every rank, so that all of them
    # resume (or all start) even where their views of a shared folder lag.
    path, world, grouped = Path(out_dir) / CHECKPOINT, distributed.world(), distributed.active()
    sharded = distributed.broadcast(_sharded_path(out_dir) if distributed.is_rank0() else None)
    if sharded is not None and not grouped and not path.exists():
        written = read(sharded / "state.pt").get("world_size")
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
    state = read(path)
    if state.get("format") != FORMAT:
        raise ConfigError(f"{path} was written by another version of stabexp (format "
                           f"{state.get('format')}, this one reads {FORMAT}): run with overwrite=true")
    changes = folder.differences(yaml.safe_load(state["config"]) or {}, cfg)
    if changes:
        raise ConfigError(folder.refusal(path, changes, "the checkpoint of another config"))
    if grouped:
        # DCP would read it inside a collective, which turns a refusal into every rank's traceback.
        _dcp_classes()[0](sharded / "model_and_optim").read_metadata()
        if state["world_size"] != world:
            raise ConfigError(f"{sharded} was written by {state['world_size']} processes, this run has {world}: "
                              f"resume it with torchrun --nproc-per-node={state['world_size']} (or overwrite=true)")
        state.update(rng=state["rng"][distributed.rank()], sharded=sharded)
    return state


def _plain_unpickler():
    """An unpickler of DCP's metadata file (`.metadata`, which DCP writes with pickle) that
    builds DCP's own metadata records and a few torch and pathlib types, and refuses any other
    global: the Python documentation's "restricting globals"."""
    from torch.distributed.checkpoint import metadata

    allowed = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
               ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
               ("torch.distributed.checkpoint.filesystem", "_StorageInfo")}
    allowed |= {(metadata.__name__, name) for name in dir(metadata) if isinstance(getattr(metadata, name), type)}

    class Plain(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) in allowed or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"global '{module}.{name}' is forbidden")

    return Plain


def _dcp_classes():
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader

    class PlainReader(FileSystemReader):
        """DCP's file reader, its metadata read by _plain_unpickler."""

        def read_metadata(self, *args, **kwargs):
            metadata_path = self._get_metadata_path(kwargs.get("rank"))
            try:
                with open(metadata_path, "rb") as f:
                    meta = _plain_unpickler()(io.BytesIO(f.read())).load()
            except pickle.UnpicklingError as err:
                raise ConfigError(f"{metadata_path} holds objects other than DCP's metadata ({err}): it was not "
                                  "loaded; delete the checkpoint, or run with overwrite=true") from None
            from torch.distributed.checkpoint.metadata import StorageMeta

            if getattr(meta, "storage_meta", None) is None:
                meta.storage_meta = StorageMeta()
            meta.storage_meta.load_id = self.load_id
            return meta

    class PlainLoadPlanner(DefaultLoadPlanner):
        """DCP's load planner, the non-tensor values (an optimiser's hyper-parameters) read with
        weights_only=True, where DCP's own planner unpickles them in full."""

        def load_bytes(self, read_item, value):
            from torch.distributed.checkpoint._traverse import set_element

            try:
                loaded = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as err:
                raise ConfigError(f"a sharded checkpoint holds objects other than plain data "
                                  f"({str(err).splitlines()[0][:120]}): it was not loaded; run with "
                                  "overwrite=true") from None
            # As DefaultLoadPlanner.load_bytes, which differs in the torch.load alone.
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return PlainReader, PlainLoadPlanner


def remove(out_dir: Path) -> None:
    if not distributed.is_rank0():
        return
    for name in (SHARDED, f"{SHARDED}.tmp", f"{SHARDED}.old"):
        shutil.rmtree(Path(out_dir) / name, ignore_errors=True)
    (Path(out_dir) / CHECKPOINT).unlink(missing_ok=True)
    for partial in Path(out_dir).glob(f".{CHECKPOINT}.*.part"):  # left by a process killed mid-write
        partial.unlink(missing_ok=True)


def save_final_weights(out_dir: Path, model, task) -> None:
    """train.save_model: the finished run's weights as model.pt (for `stabexp export` and one's
    own analysis), with what rebuilds the model; under FSDP2 gathered whole on every rank (a
    collective) and written by rank 0."""
    weights = model.state_dict()
    if distributed.is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    saved = {"state_dict": weights, "vocab_size": task.vocab_size, "pad_id": task.pad_id,
             "max_positions": task.max_positions}
    if distributed.is_rank0():
        write_atomic(Path(out_dir) / MODEL, lambda f: torch.save(saved, f))
