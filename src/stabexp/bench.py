"""`stabexp bench`: training speed and peak memory of stabexp against a plain PyTorch loop.

Variants, for each model size and depth (N encoder + N decoder layers, same batch and task):
  a          torch.nn.Transformer (Post-LN, batch_first) in the loop a researcher would write:
             default Adam, no probes, the task's dropout and label smoothing, and on padded
             batches (--task multi30k) the padding masks of PyTorch's translation tutorial. The
             baseline.
  b:GROUP    stabexp postln / deepnorm / admin with probes off (probe.enabled=false); b:postln
             is the like-for-like comparison with a, the other two give each group's own
             probes-off reference.
  c:GROUP    the same groups with the default probes: one probe every probe.every=10 steps
             (the one-off dense window of the first 20 steps is not part of the steady state
             measured here: probe.first_steps=0).
  d:GROUP    the same with probes at every step.
  e:GROUP    b with activation checkpointing (train.activation_checkpointing=true): each layer
             recomputed in the backward pass. Not measured unless asked for (--variants).
Probe cost is c or d against b of the same group; for e the same column is the cost of the
recomputation.

Tasks: `reverse` (fixed batches of 64 x 10 tokens) or `multi30k` (real De-En batches of at most
--max-tokens padded tokens, length-bucketed; every variant draws the same batches, from the
same seed). Speed: all variants live in one process; each repeat times a window of `steps`
optimiser steps of every variant in turn (interleaved), so drifts of the machine hit all alike.
Reported: median steps/s and target tokens/s (real tokens, padding excluded) over repeats, and
the median over repeats of each variant's speed / a's speed in that repeat (in tokens, so
windows of different batches compare). Eval passes are not timed (train.eval_every is set
beyond the window).

Model FLOPs: one step of each variant after its warm-up, counted by torch's FlopCounterMode
(the matrix products and attention of the forward and backward passes; not the optimiser's
elementwise work), per target token; a variant with probes or activation checkpointing is given
its probes-off variant's count, so that its probes and recomputation are not counted as model
work. Model FLOPs utilisation (MFU) is the FLOPs per second this gives over the GPU's dense peak
at the run's precision (stabexp.plan.GPUS: A100, H100, H200); "-" on a CPU or another GPU.

Peak memory: one fresh subprocess per variant (so variants do not share a high-water mark),
`probe_window` steps including probe steps; on CUDA torch.cuda.max_memory_allocated, on the
CPU the growth of peak RSS (VmHWM, reset just before the model is built) over the RSS then.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import torch
import torch.nn as nn
import torch.nn.functional as F

from stabexp.config import ConfigError, ProbeConfig
from stabexp.paths import outputs_dir
from stabexp.train.files import json_text
from stabexp.memory import peak_rss_kib, reset_peak_rss_kib
from stabexp.terminal import Counter

GROUPS = ("postln", "deepnorm", "admin")
SIZES = {"tiny": (64, 128, 2), "small": (256, 1024, 4), "base": (512, 2048, 8)}
TASKS = ("reverse", "multi30k")


def task_overrides(task: str, batch_size: int, max_tokens: int) -> List[str]:
    if task == "reverse":
        return ["task=reverse", f"train.batch_size={batch_size}", "task.vocab_size=16", "task.seq_len=10"]
    return ["task=multi30k", f"train.max_tokens={max_tokens}", "train.batch_size=0"]


def variant_names(kinds: str = "bcd") -> List[str]:
    """The variants measured by default; kinds="bcde" adds the checkpointing ones."""
    return ["a"] + [f"{kind}:{g}" for kind in kinds for g in GROUPS]


def probes_off(variant: str) -> str:
    """The probes-off variant of the same group: what a variant's probe cost is measured against."""
    return "b:" + variant.partition(":")[2] if variant != "a" else "a"


# --- the baseline: what a researcher writes with torch.nn.Transformer ------------------------

class BaselineLoop:
    def __init__(self, size: str, depth: int, cfg, seed: int, device: torch.device):
        from stabexp.data import make_task
        from stabexp.model.transformer import sinusoidal_positions

        d, ffn, heads = SIZES[size]
        torch.manual_seed(seed)
        self.task = task = make_task(cfg, device)
        self.d, self.pad, self.device = d, task.pad_id, device
        self.embed = nn.Embedding(task.vocab_size, d).to(device)
        self.positions = sinusoidal_positions(task.max_positions, d).to(device)
        self.transformer = nn.Transformer(d, heads, depth, depth, ffn, dropout=cfg.model.dropout,
                                          batch_first=True).to(device)
        params = list(self.embed.parameters()) + list(self.transformer.parameters())
        self.opt = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.98))
        # At the run's precision, as stabexp's Run autocasts (train.precision=bf16).
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.train.precision == "bf16")

    def step(self, step: int) -> bool:
        src, tgt_in, tgt_out = self.task.train_batch()
        scale = math.sqrt(self.d)
        with self.autocast:
            x = self.embed(src) * scale + self.positions[: src.shape[1]]
            y = self.embed(tgt_in) * scale + self.positions[: tgt_in.shape[1]]
            if self.pad is None:
                causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[1], device=self.device)
                out = self.transformer(x, y, tgt_mask=causal, tgt_is_causal=True)
            else:  # boolean masks throughout (True: do not attend), as PyTorch wants them matched
                T = tgt_in.shape[1]
                causal = torch.ones(T, T, dtype=torch.bool, device=self.device).triu(1)
                src_pad, tgt_pad = src == self.pad, tgt_in == self.pad
                out = self.transformer(x, y, tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=src_pad,
                                       tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
            logits = F.linear(out, self.embed.weight)
        loss = self.task.loss(logits.float(), tgt_out)  # the same loss as stabexp's
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return math.isfinite(loss.item())


# --- stabexp's own loop ------------------------------------------------------------------

def variant_config(variant: str, size: str, depth: int, task: List[str], seed: int, device: str):
    """The composed config of a variant: what `stabexp run` would train."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from stabexp.paths import conf_dir

    kind, _, group = variant.partition(":")
    overrides = [f"group={group or 'postln'}", f"model={size}", f"depth={depth}", *task,
                 f"seed={seed}", f"train.device={device}",
                 "train.steps=1000000000", "train.eval_every=1000000000"]
    # The dense window of the first steps is a one-off: the bench measures the steady state.
    overrides += {"a": [], "b": ["probe.enabled=false"], "c": ["probe.first_steps=0"],
                  "d": ["probe.every=1"], "e": ["probe.enabled=false", "train.activation_checkpointing=true"]}[kind]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    GlobalHydra.instance().clear()
    return cfg


def make_loop(variant: str, size: str, depth: int, task: List[str], seed: int, device: torch.device, out: Path):
    """The baseline loop (a) or a train.run.Run, whose .step is the exact step `stabexp run` executes."""
    from stabexp.data import make_task
    from stabexp.train.run import Run

    cfg = variant_config(variant, size, depth, task, seed, device.type)
    if variant == "a":
        return BaselineLoop(size, depth, cfg, seed, device)
    out.mkdir(parents=True, exist_ok=True)
    return Run(cfg, out, {}, time.perf_counter(), make_task(cfg, device), show_progress=False)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def model_flops_per_token(loop, step: int) -> float:
    """The FLOPs torch counts in one training step of `loop`, over the target tokens it consumed."""
    from torch.utils.flop_counter import FlopCounterMode

    tokens_before = loop.task.target_tokens
    counter = FlopCounterMode(display=False)
    with counter:
        loop.step(step)
    return counter.get_total_flops() / max(loop.task.target_tokens - tokens_before, 1)


def peak_tflops(device: torch.device, precision: str) -> float:
    """The GPU's dense peak at this precision (stabexp.plan.GPUS), NaN on a CPU or an unlisted GPU."""
    from stabexp.plan import GPUS

    if device.type != "cuda":
        return float("nan")
    name = torch.cuda.get_device_name(device).lower()
    gpu = next((g for g in GPUS if g in name), None)
    return GPUS[gpu]["bf16" if precision == "bf16" else "fp32"] if gpu else float("nan")


def measure_speed(size: str, depth: int, steps: int, repeats: int, task: List[str],
                  device: torch.device, seed: int = 0, variants: List[str] = (), counter=None) -> Dict[str, Dict]:
    """Seconds per step and per target token of every variant, interleaved windows; medians of
    paired ratios (in tokens per second, so that windows of different batches compare)."""
    every = ProbeConfig().every  # the default probe period: a window of (c) holds whole periods
    windows = {v: (math.ceil(steps / every) * every if v.startswith("c:") else steps)
               for v in variants or variant_names()}
    with tempfile.TemporaryDirectory() as tmp:
        loops = {v: make_loop(v, size, depth, task, seed, device, Path(tmp) / v.replace(":", "_"))
                 for v in windows}
        next_step = {}
        flops = {}
        for v, loop in loops.items():  # warm-up: allocator, kernels, Adam state; then one counted step
            loop.step(1)
            loop.step(2)
            flops[v] = model_flops_per_token(loop, 3)
            next_step[v] = 4
            if counter:
                counter.update()
        # Model work only: a probing or recomputing variant takes its probes-off variant's count.
        flops = {v: flops.get(probes_off(v), f) for v, f in flops.items()}
        per_step = {v: [] for v in loops}
        per_token = {v: [] for v in loops}
        for _ in range(repeats):
            for v, loop in loops.items():
                first, n = next_step[v], windows[v]
                tokens_before = loop.task.target_tokens
                _sync(device)
                t0 = time.perf_counter()
                for i in range(first, first + n):
                    loop.step(i)
                _sync(device)
                elapsed = time.perf_counter() - t0
                per_step[v].append(elapsed / n)
                per_token[v].append(elapsed / (loop.task.target_tokens - tokens_before))
                next_step[v] = first + n
                if counter:  # outside the timed window
                    counter.update()
        for loop in loops.values():
            if hasattr(loop, "close"):
                loop.close()
    result = {}
    nan = float("nan")
    for v, ts in per_step.items():
        base, tok, a = per_token.get(probes_off(v)), per_token[v], per_token.get("a")
        result[v] = {
            "steps_per_s": statistics.median(1 / t for t in ts),
            "tokens_per_s": statistics.median(1 / t for t in tok),
            "speed_vs_a": statistics.median(a[r] / tok[r] for r in range(repeats)) if a else nan,
            "probe_cost": statistics.median(tok[r] / base[r] - 1 for r in range(repeats)) if base else nan,
            "flops_per_token": flops[v],
        }
        result[v]["model_tflops"] = flops[v] * result[v]["tokens_per_s"] / 1e12
    return result


def _peak_memory_child(variant: str, size: str, depth: int, task: List[str], device_name: str,
                       window: int) -> float:
    """Peak memory in MiB of `window` steps of one variant (run in a fresh process)."""
    device = torch.device(device_name)
    before = reset_peak_rss_kib()
    with tempfile.TemporaryDirectory() as tmp:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        loop = make_loop(variant, size, depth, task, 0, device, Path(tmp))
        # Steps every-1, every, ...: the window holds a probe step of the default schedule.
        first = ProbeConfig().every - 1
        for i in range(first, first + window):
            loop.step(i)
        if device.type == "cuda":
            return torch.cuda.max_memory_allocated() / 2 ** 20
        return (peak_rss_kib() - before) / 1024


def measure_memory(variant: str, size: str, depth: int, task: List[str], device: torch.device,
                   window: int) -> float:
    cmd = [sys.executable, "-m", "stabexp.bench", "--memory-child", variant, size, str(depth),
           json.dumps(task), device.type, str(window)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def run_bench(sizes, depths, steps, repeats, task_name: str, batch_size: int, max_tokens: int, memory: bool,
              out: Path, overrides: List[str] = (), variants: List[str] = ()) -> Dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"# device {device} ({name}), torch {torch.__version__}", file=sys.stderr, flush=True)
    task = task_overrides(task_name, batch_size, max_tokens) + list(overrides)
    precision = variant_config("a", sizes[0], depths[0], task, 0, device.type).train.precision if sizes and depths else "fp32"
    peak = peak_tflops(device, precision)
    rows = []
    for size in sizes:
        for depth in depths:
            t0 = time.perf_counter()
            chosen = list(variants or variant_names())
            # Each variant's warm-up, its timed windows and its memory process.
            counter = Counter(len(chosen) * (1 + repeats + memory), f"{size} {depth}L-{depth}L")
            speed = measure_speed(size, depth, steps, repeats, task, device, variants=chosen, counter=counter)
            mem = {}
            for v in chosen if memory else ():
                mem[v] = measure_memory(v, size, depth, task, device, window=3)
                counter.update()
            counter.close()
            for v in chosen:
                rows.append({"size": size, "depth": depth, "variant": v, **speed[v],
                             "mfu": speed[v]["model_tflops"] / peak if peak == peak else None,
                             "peak_mib": mem.get(v),
                             "mem_vs_b": mem[v] / mem[probes_off(v)] if probes_off(v) in mem else None})
            print(f"# {size} {depth}L-{depth}L measured in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    batches = (f"batch {batch_size} x 10 tokens" if task_name == "reverse" else
               f"Multi30k De-En batches of at most {max_tokens} padded tokens")
    report = {"device": f"{device} ({name})" if device.type == "cuda" else str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "task": task_name, "batches": batches, "overrides": list(overrides), "steps_per_window": steps,
              "precision": precision, "peak_tflops": peak if peak == peak else None,
              "repeats": repeats, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json_text(report))
    return report


def format_table(report: Dict) -> str:
    """Markdown: one row per size, depth and variant, with probe overheads against b."""
    lines = [f"device {report['device']}, torch {report['torch']}, {report['threads']} threads, "
             f"{report['batches']}, medians over "
             f"{report['repeats']} interleaved windows of {report['steps_per_window']} steps "
             f"(10 for c)",
             "", "| size | depth | variant | steps/s | target tokens/s | speed vs a | probe cost vs b | model TFLOP/s | "
             "MFU | peak MiB | memory vs b |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        cost = f"{r['probe_cost']:+.1%}" if r["variant"] != "a" and r["probe_cost"] == r["probe_cost"] else "-"
        mem = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "-"
        mem_ratio = f"{r['mem_vs_b']:.2f}" if r["mem_vs_b"] is not None and r["variant"] != "a" else "-"
        vs_a = f"{r['speed_vs_a']:.2f}" if r["speed_vs_a"] == r["speed_vs_a"] else "-"
        tflops = f"{r['model_tflops']:.3g}" if r.get("model_tflops") is not None else "-"
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"
        lines.append(f"| {r['size']} | {r['depth']} | {r['variant']} | {r['steps_per_s']:.2f} | "
                     f"{r['tokens_per_s']:.0f} | {vs_a} | {cost} | {tflops} | {mfu} | {mem} | {mem_ratio} |")
    return "\n".join(lines)


def parse_args(argv=None):
    """The checked arguments of `stabexp bench` (a bad one exits with code 2 and one line)."""
    parser = argparse.ArgumentParser(prog="stabexp bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="tiny,small", help="comma list of tiny, small, base")
    parser.add_argument("--depths", default="6,18,50", help="comma list of layers per stack")
    parser.add_argument("--steps", type=int, default=10,
                        help="steps per timed window (c's windows are rounded up to whole probe periods of 10)")
    parser.add_argument("--repeats", type=int, default=5, help="timed windows per variant")
    parser.add_argument("--task", default="reverse", help="reverse (synthetic batches) or multi30k (real text)")
    parser.add_argument("--batch-size", type=int, default=64, help="reverse: sequences per batch")
    parser.add_argument("--max-tokens", type=int, default=4096, help="multi30k: padded tokens per batch")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every variant (repeatable), e.g. task.path=DIR")
    parser.add_argument("--variants", default="", help="comma list of the variants to measure (default: all, "
                        "a and b:/c:/d: of postln, deepnorm, admin; e: is b with activation checkpointing), e.g. "
                        "b:deepnorm,e:deepnorm")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default outputs/bench/bench.json)")
    parser.add_argument("--memory-child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        return parser, args
    sizes = [s for s in args.sizes.split(",") if s]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        parser.exit(2, f"stabexp bench: error: --sizes {','.join(bad)} not allowed: choose from {', '.join(SIZES)}\n")
    try:
        depths = [int(d) for d in args.depths.split(",") if d]
        assert depths and all(d >= 1 for d in depths)
    except (ValueError, AssertionError):
        parser.exit(2, f"stabexp bench: error: --depths {args.depths} not allowed: integers >= 1, comma-separated\n")
    if args.steps < 1 or args.repeats < 1 or args.batch_size < 1 or args.max_tokens < 1:
        parser.exit(2, "stabexp bench: error: --steps, --repeats, --batch-size and --max-tokens must be >= 1\n")
    if args.task not in TASKS:
        parser.exit(2, f"stabexp bench: error: --task {args.task} not allowed: choose from {', '.join(TASKS)}\n")
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in variant_names("bcde")]
    if bad:
        parser.exit(2, f"stabexp bench: error: --variants {','.join(bad)} not allowed: choose from "
                       f"{', '.join(variant_names('bcde'))}\n")
    args.sizes, args.depths, args.variants = sizes, depths, variants
    return parser, args


def main(argv=None) -> int:
    parser, args = parse_args(argv)
    if args.memory_child:
        v, size, depth, task, dev, window = args.memory_child
        print(_peak_memory_child(v, size, int(depth), json.loads(task), dev, int(window)))
        return 0
    sizes, depths = args.sizes, args.depths
    out = args.out or outputs_dir() / "bench" / "bench.json"
    try:
        report = run_bench(sizes, depths, args.steps, args.repeats, args.task, args.batch_size, args.max_tokens,
                           not args.no_memory, out, args.override, args.variants)
    except ConfigError as err:  # the data: a failed download, a bad corpus
        parser.exit(2, f"stabexp bench: error: {err}\n")
    print(format_table(report))
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
