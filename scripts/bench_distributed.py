"""Training speed and peak memory of one run on 1 process and on K processes (DDP, FSDP2).

    python scripts/bench_distributed.py [--sizes tiny,small,base] [--depth 6] [--steps 40]
                                        [--nproc 2] [--out outputs/bench/distributed.json]

For each model size (model=tiny|small|base, N encoder + N decoder layers, DeepNorm, the reversal
task's batches of 64 x 10 tokens, probes off, one torch thread per process) it runs
`stabexp run` on one process (train.parallel=none) and through `torchrun --nproc-per-node=K`
with train.parallel=ddp and =fsdp, on the same global batch. Speed: target tokens per second
between the run's two eval rows (steps/2 and steps), so building the model and the first steps
are not counted. Memory: each rank's peak (summary.json's peak_memory_mib_ranks; on the CPU the
process's peak resident set over the run). Writes the table (markdown) to stdout and the
figures to --out. Time it alone: K processes of one thread each need K free cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def run(size: str, depth: int, steps: int, parallel: str, nproc: int, folder: Path) -> dict:
    overrides = [f"model={size}", f"depth={depth}", "group=deepnorm", "task=reverse", "train.batch_size=64",
                 "task.vocab_size=16", "task.seq_len=10", "probe.enabled=false", f"train.steps={steps}",
                 f"train.eval_every={steps // 2}", "train.threads=1", "train.device=cpu",
                 "train.checkpoint_every=0", f"train.parallel={parallel}", f"hydra.run.dir={folder}"]
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
                if parallel != "none" else [sys.executable])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([*launcher, "-m", "stabexp", "run", *overrides], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{size} {parallel} failed:\n{done.stderr[-2000:]}")
    summary = json.loads((folder / "summary.json").read_text())
    with open(folder / "metrics.csv", newline="") as f:
        evals = [row for row in csv.DictReader(f) if row["eval_loss"] and int(row["step"]) > 0]
    first, last = evals[0], evals[-1]
    window_steps = int(last["step"]) - int(first["step"])
    seconds = float(last["elapsed_s"]) - float(first["elapsed_s"])
    tokens_per_step = summary["target_tokens"] / summary["steps_done"]
    return {"size": size, "depth": depth, "parallel": parallel, "processes": nproc if parallel != "none" else 1,
            "steps_per_second": window_steps / seconds, "tokens_per_second": window_steps * tokens_per_step / seconds,
            "peak_memory_mib_ranks": summary.get("peak_memory_mib_ranks", [summary["peak_memory_mib"]]),
            "final_eval_loss": summary["final_eval_loss"], "parameters": summary["parameters"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,small,base")
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--out", default="outputs/bench/distributed.json")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            for parallel in ("none", "ddp", "fsdp"):
                rows.append(run(size, args.depth, args.steps, parallel, args.nproc, Path(tmp) / f"{size}-{parallel}"))
                print(f"# {size} {parallel}: {rows[-1]['tokens_per_second']:.0f} tokens/s", file=sys.stderr)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    print("| size | parameters | run | tokens/s | vs 1 process | peak MiB per rank | final eval loss |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        one = next(r for r in rows if r["size"] == row["size"] and r["parallel"] == "none")
        name = "1 process" if row["parallel"] == "none" else f"{row['parallel']}, {row['processes']} processes"
        peaks = " / ".join(f"{p:.0f}" for p in row["peak_memory_mib_ranks"])
        print(f"| {row['size']} {row['depth']}L-{row['depth']}L | {row['parameters'] / 1e6:.2f} M | {name} | {row['tokens_per_second']:.0f} | "
              f"{row['tokens_per_second'] / one['tokens_per_second']:.2f} | {peaks} | {row['final_eval_loss']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
