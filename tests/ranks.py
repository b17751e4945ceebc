"""Run train(cfg, out_dir) on K processes (gloo, CPU) from a test: torch.multiprocessing.spawn
with a file:// rendezvous (no port to pick), a deadline so that a hang fails the test, and
ranks > 0 checked to write nothing into the run folder but their checkpoint shards."""

from __future__ import annotations

import builtins
import io
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Optional

import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf


class WroteFiles(AssertionError):
    pass


def _no_writes_under(folder: Path):
    """Patch open() (for writing), and the renames, removals and mkdirs of os and shutil, so
    that changing anything under `folder` (its checkpoint/ shards aside) raises."""
    def check(file):
        if isinstance(file, (str, os.PathLike)):
            path = Path(file).resolve()
            if (folder == path or folder in path.parents) and not any(
                    p.name.startswith("checkpoint") for p in [path, *path.parents]):
                raise WroteFiles(f"rank {os.environ.get('RANK')} changed {path}")

    real_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            check(file)
        return real_open(file, mode, *args, **kwargs)
    builtins.open = io.open = guarded_open

    def guard(module, name, *checked):
        real = getattr(module, name)

        def guarded(*args, **kwargs):
            for i in checked:
                if i < len(args):
                    check(args[i])
            return real(*args, **kwargs)
        setattr(module, name, guarded)
    for name in ("replace", "rename"):
        guard(os, name, 0, 1)
    for name in ("unlink", "remove", "mkdir", "rmdir"):
        guard(os, name, 0)
    guard(shutil, "rmtree", 0)


def _rank_main(rank: int, world: int, store: str, cfg_yaml: str, out_dir: str, exit_after: Optional[int],
               env: dict) -> None:
    os.environ.update(env, RANK=str(rank))
    torch.set_num_threads(1)
    from stabexp import distributed
    from stabexp.train import trainer

    distributed.setup(init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        if rank > 0:
            _no_writes_under(Path(out_dir).resolve())
        if exit_after is not None:  # both ranks die after this step, as under SIGKILL
            real = trainer.Run.step

            def step(self, i):
                done = real(self, i)
                if i == exit_after:
                    os._exit(137)
                return done
            trainer.Run.step = step
        trainer.train(OmegaConf.create(cfg_yaml), Path(out_dir))
    finally:
        distributed.teardown()


def run_ranks(cfg, out_dir: Path, world: int = 2, exit_after: Optional[int] = None, timeout: float = 240) -> None:
    """train(cfg, out_dir) on `world` ranks; with `exit_after`, every rank exits (137) after
    that step, and this returns once they have."""
    store = Path(out_dir).parent / f".store-{uuid.uuid4().hex}"
    env = {"STABEXP_DIST_TIMEOUT_S": "60", "OMP_NUM_THREADS": "1", "STABEXP_DATA": os.environ["STABEXP_DATA"]}
    ctx = mp.spawn(_rank_main, args=(world, str(store), OmegaConf.to_yaml(cfg), str(out_dir), exit_after, env),
                   nprocs=world, join=False)
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world} ranks did not finish within {timeout} s")
    except mp.ProcessExitedException as err:
        if exit_after is None or err.exit_code != 137:
            raise
        for p in ctx.processes:  # the other ranks exit at the same step
            p.join(30)
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
        store.unlink(missing_ok=True)


def _call_main(rank: int, world: int, store: str, fn, args: tuple, env: dict) -> None:
    os.environ.update(env, RANK=str(rank))
    torch.set_num_threads(1)
    from stabexp import distributed

    distributed.setup(init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        fn(*args)
    finally:
        distributed.teardown()


def call_on_ranks(fn, *args, world: int = 2, timeout: float = 240) -> None:
    """fn(*args) on `world` gloo ranks (fn defined at the top level of a module, so that the
    spawned processes can import it)."""
    store = Path(os.environ.get("TMPDIR", "/tmp")) / f".store-{uuid.uuid4().hex}"
    env = {"STABEXP_DIST_TIMEOUT_S": "60", "OMP_NUM_THREADS": "1", "STABEXP_DATA": os.environ["STABEXP_DATA"]}
    ctx = mp.spawn(_call_main, args=(world, str(store), fn, args, env), nprocs=world, join=False)
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world} ranks did not finish within {timeout} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
        store.unlink(missing_ok=True)
