"""The CUDA path end to end, in a few minutes on one GPU: a maintainer's check.

    python scripts/gpu_check.py [--device cuda] [--quick] [--no-bench] [--out outputs/gpu_check]

1. DeepNorm 18L-18L (tiny width, the default task, 200 steps, probes on) in fp32 and in bf16:
   steps/s, peak memory, final eval loss (bf16 close to fp32, not equal).
2. `stabexp bench` (tiny and base width, 6L-6L): stabexp against torch.nn.Transformer
   (--no-bench: skipped; scripts/paper_scale.py measures its own).
3. The same fp32 run on one process group of one rank (torchrun --nproc-per-node=1) with
   train.parallel=ddp and =fsdp, probe.weights and probe.update_bound on: the one-process
   numbers (nccl on a GPU), FSDP's model sharded as it is built and its probes read from shards;
   and FSDP with bf16 mixed precision (MixedPrecisionPolicy).
4. `stabexp plan` of each of those runs against its measured peak (max_memory_allocated on a
   GPU, the peak resident set less the memory before the model on the CPU).
Prints a markdown table and writes each part's files under --out. `--device cpu --quick` runs
the same steps on the CPU at a smaller size (tests/test_paper_scale.py does, through
scripts/paper_scale.py, so the script stays runnable where no GPU is).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path


def stabexp(*args, nproc: int = 0) -> str:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
                if nproc else [sys.executable])
    done = subprocess.run([*launcher, "-m", "stabexp", *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    if done.returncode != 0:
        raise SystemExit(f"failed: stabexp {' '.join(args)}\n{done.stderr[-3000:]}")
    return done.stdout


def planned_mib(overrides, world: int) -> float:
    """`stabexp plan`'s peak per rank for these overrides, in MiB."""
    return json.loads(stabexp("plan", *overrides, f"--world={world}", "--json").strip().splitlines()[-1])["peak"] / 2 ** 20


def metrics(folder: Path):
    with open(folder / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def largest_difference(a: Path, b: Path, column: str) -> float:
    """The largest relative difference of a metrics column between two runs, row by row; inf
    when the rows differ in number or one run has a NaN where the other has a number."""
    rows_a, rows_b = metrics(a), metrics(b)
    if len(rows_a) != len(rows_b):
        return math.inf
    worst = 0.0
    for x, y in zip(rows_a, rows_b):
        if not x[column] and not y[column]:
            continue
        u, v = float(x[column] or "nan"), float(y[column] or "nan")
        if math.isnan(u) and math.isnan(v):
            continue
        difference = abs(u - v) / max(abs(u), 1e-12)
        worst = max(worst, difference if not math.isnan(difference) else math.inf)
    return worst


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="2 layers, 20 steps, the tiny bench only")
    parser.add_argument("--no-bench", action="store_true", help="skip part 2, stabexp bench")
    parser.add_argument("--out", default="outputs/gpu_check")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    depth, steps, sizes, bench_steps = (2, 20, "tiny", "2") if args.quick else (18, 200, "tiny,base", "5")
    base = ["group=deepnorm", f"depth={depth}", f"train.steps={steps}", f"train.device={args.device}",
            "model.dropout=0.0", f"train.eval_every={steps // 2}"]
    rows = []
    for precision in ("fp32", "bf16"):
        folder = out / precision
        stabexp("run", *base, f"train.precision={precision}", f"hydra.run.dir={folder}")
        rows.append((f"{precision}, 1 process", json.loads((folder / "summary.json").read_text()), folder))
    probes = ["probe.weights=true", "probe.update_bound=true"]
    plans = {}
    for name, precision, parallel in (("fp32, ddp on 1 rank", "fp32", "ddp"), ("fp32, fsdp on 1 rank", "fp32", "fsdp"),
                                      ("bf16, fsdp on 1 rank", "bf16", "fsdp")):
        folder = out / f"{parallel}_{precision}"
        overrides = [*base, *probes, f"train.parallel={parallel}", f"train.precision={precision}"]
        stabexp("run", *overrides, f"hydra.run.dir={folder}", nproc=1)
        rows.append((name, json.loads((folder / "summary.json").read_text()), folder))
        plans[folder] = planned_mib(overrides, 1)
    bench = out / "bench.json"
    if not args.no_bench:
        stabexp("bench", "--sizes", sizes, "--depths", "6" if not args.quick else "2", "--steps", bench_steps,
                "--repeats", "2", "--no-memory",
                "--out", str(bench))  # on the GPU when there is one
    fp32 = rows[0][2]
    print(f"{depth}L-{depth}L DeepNorm, tiny width, {steps} steps, train.device={args.device}\n")
    print("| run | steps/s | peak MiB | planned MiB | final eval loss | largest relative difference from fp32 "
          "(loss, model update) |")
    print("|---|---|---|---|---|---|")
    for name, summary, folder in rows:
        diff = ("-" if folder == fp32 else
                f"{largest_difference(fp32, folder, 'loss'):.1e}, {largest_difference(fp32, folder, 'model_update'):.1e}")
        own = summary["peak_memory_mib"] - summary.get("memory_before_model_mib", 0.0)  # the run's own
        plan = f"{plans[folder]:.0f}" if folder in plans else "-"
        print(f"| {name} | {summary['steps_per_second']:.2f} | {own:.0f} | {plan} | "
              f"{summary['final_eval_loss']:.4f} | {diff} |")
    if not args.no_bench:
        print(f"\nstabexp bench: {bench}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
