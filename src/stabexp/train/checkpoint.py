"""A run's checkpoint: everything a resumed run needs to continue as if it had never stopped.

Written at the end of a step (every train.checkpoint_every steps, and when the process is asked
to stop: SIGTERM, SIGINT, SIGUSR1), atomically, to run_folder/checkpoint.pt. It holds the model,
the optimiser, the lr schedule, every random stream (torch's global generator, which drives
dropout; the task's data streams; CUDA's generators), the probes' state (F(x, theta_0), the
weight snapshots, which weights are scale-invariant), the run's counters and results so far,
the summary written at start, and where each CSV stood. On the CPU a resumed run writes the
same files, bit for bit, as one that never stopped (tests/test_resume.py), the wall-clock
columns (elapsed_s, wall_seconds, ...) aside. It is deleted when the run finishes.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Dict, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from stabexp.errors import ConfigError
from stabexp.atomic import write_atomic

CHECKPOINT = "checkpoint.pt"
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
    """The config a checkpoint belongs to; `overwrite` says what to do with a folder, not what
    runs in it."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("overwrite", None)
    return OmegaConf.to_yaml(OmegaConf.create(plain))


def save(out_dir: Path, state: Dict) -> None:
    write_atomic(Path(out_dir) / CHECKPOINT, lambda f: torch.save({"format": FORMAT, **state}, f))


def load(out_dir: Path, cfg: DictConfig) -> Optional[Dict]:
    """The folder's checkpoint, or None when it has none; a checkpoint of another config is an
    error (the folder name comes from the overrides, so this means the configs changed)."""
    path = Path(out_dir) / CHECKPOINT
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
    return state


def remove(out_dir: Path) -> None:
    (Path(out_dir) / CHECKPOINT).unlink(missing_ok=True)
    for partial in Path(out_dir).glob(f".{CHECKPOINT}.*.part"):  # left by a process killed mid-write
        partial.unlink(missing_ok=True)
