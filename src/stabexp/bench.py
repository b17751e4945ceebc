"""`stabexp bench`: training speed and peak memory of stabexp against a plain PyTorch loop.

Variants, for each model size and depth (N encoder + N decoder layers, same batch and task):
  a          torch.nn.Transformer (Post-LN, batch_first) in the loop a researcher would write:
             default Adam, no probes. The baseline.
  b:GROUP    stabexp postln / deepnorm / admin with probes off (probe.enabled=false); b:postln
             is the issue's (b), the other two give each group's own probes-off reference.
  c:GROUP    the same groups with the default probes: one probe every probe.every=10 steps
             (the one-off dense window of the first 20 steps is not part of the steady state
             measured here: probe.first_steps=0).
  d:GROUP    the same with probes at every step.
Probe cost is c or d against b of the same group.

Speed: all variants live in one process; each repeat times a window of `steps` optimiser
steps of every variant in turn (interleaved), so drifts of the machine hit all alike. Reported:
median steps/s over repeats, and the median over repeats of each variant's speed / a's speed in
that repeat. Eval passes are not timed (train.eval_every is set beyond the window).

Peak memory: one fresh subprocess per variant (so variants do not share a high-water mark),
`probe_window` steps including probe steps; on CUDA torch.cuda.max_memory_allocated, on the
CPU the growth of peak RSS (VmHWM, reset just before the model is built) over the RSS then.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
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

from stabexp.config import ProbeConfig, outputs_dir

GROUPS = ("postln", "deepnorm", "admin")
SIZES = {"tiny": (64, 128, 2), "small": (256, 1024, 4), "base": (512, 2048, 8)}


def variant_names() -> List[str]:
    return ["a"] + [f"{kind}:{g}" for kind in "bcd" for g in GROUPS]


def probes_off(variant: str) -> str:
    """The probes-off variant of the same group: what a variant's probe cost is measured against."""
    return "b:" + variant.partition(":")[2] if variant != "a" else "a"


# --- the baseline: what a researcher writes with torch.nn.Transformer ------------------------

class BaselineLoop:
    def __init__(self, size: str, depth: int, batch_size: int, seed: int, device: torch.device):
        from stabexp.data import ReverseTask
        from stabexp.model.transformer import sinusoidal_positions

        d, ffn, heads = SIZES[size]
        torch.manual_seed(seed)
        self.task = ReverseTask(16, 10, seed, device)
        self.batch_size, self.d = batch_size, d
        self.embed = nn.Embedding(16, d).to(device)
        self.positions = sinusoidal_positions(64, d).to(device)
        self.transformer = nn.Transformer(d, heads, depth, depth, ffn, dropout=0.0,
                                          batch_first=True).to(device)
        self.mask = nn.Transformer.generate_square_subsequent_mask(10, device=device)
        params = list(self.embed.parameters()) + list(self.transformer.parameters())
        self.opt = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.98))

    def step(self, step: int) -> bool:
        src, tgt_in, tgt_out = self.task.train_batch(self.batch_size)
        scale = math.sqrt(self.d)
        x = self.embed(src) * scale + self.positions[: src.shape[1]]
        y = self.embed(tgt_in) * scale + self.positions[: tgt_in.shape[1]]
        out = self.transformer(x, y, tgt_mask=self.mask, tgt_is_causal=True)
        loss = F.cross_entropy(F.linear(out, self.embed.weight).flatten(0, 1), tgt_out.flatten())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return math.isfinite(loss.item())


# --- stabexp's own loop ------------------------------------------------------------------

def stabexp_run(variant: str, size: str, depth: int, batch_size: int, seed: int, device: str, out: Path):
    """A trainer.Run for a variant; its .step is the exact step `stabexp run` executes."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from stabexp.config import conf_dir
    from stabexp.train.trainer import Run

    kind, _, group = variant.partition(":")
    overrides = [f"group={group or 'postln'}", f"model={size}", f"depth={depth}",
                 f"seed={seed}", f"train.batch_size={batch_size}", f"train.device={device}",
                 "train.steps=1000000000", "train.eval_every=1000000000",
                 "task.vocab_size=16", "task.seq_len=10"]
    # The dense window of the first steps is a one-off: the bench measures the steady state.
    overrides += {"b": ["probe.enabled=false"], "c": ["probe.first_steps=0"],
                  "d": ["probe.every=1"]}[kind]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    GlobalHydra.instance().clear()
    out.mkdir(parents=True, exist_ok=True)
    return Run(cfg, out, {}, time.perf_counter(), show_progress=False)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_speed(size: str, depth: int, steps: int, repeats: int, batch_size: int,
                  device: torch.device, seed: int = 0) -> Dict[str, Dict]:
    """Seconds per step of every variant, interleaved windows; medians of paired ratios."""
    every = ProbeConfig().every  # the default probe period: a window of (c) holds whole periods
    windows = {v: (math.ceil(steps / every) * every if v.startswith("c:") else steps)
               for v in variant_names()}
    with tempfile.TemporaryDirectory() as tmp:
        loops = {"a": BaselineLoop(size, depth, batch_size, seed, device)}
        for v in variant_names()[1:]:
            loops[v] = stabexp_run(v, size, depth, batch_size, seed, device.type,
                                   Path(tmp) / v.replace(":", "_"))
        next_step = {}
        for v, loop in loops.items():  # warm-up: allocator, kernels, Adam state
            loop.step(1)
            loop.step(2)
            next_step[v] = 3
        per_step = {v: [] for v in loops}
        for _ in range(repeats):
            for v, loop in loops.items():
                first, n = next_step[v], windows[v]
                _sync(device)
                t0 = time.perf_counter()
                for i in range(first, first + n):
                    loop.step(i)
                _sync(device)
                per_step[v].append((time.perf_counter() - t0) / n)
                next_step[v] = first + n
        for loop in loops.values():
            if hasattr(loop, "close"):
                loop.close()
    result = {}
    for v, ts in per_step.items():
        base = per_step[probes_off(v)]
        result[v] = {
            "steps_per_s": statistics.median(1 / t for t in ts),
            "speed_vs_a": statistics.median(per_step["a"][r] / ts[r] for r in range(repeats)),
            "probe_cost": statistics.median(ts[r] / base[r] - 1 for r in range(repeats)),
        }
    return result


def _peak_memory_child(variant: str, size: str, depth: int, batch_size: int, device_name: str,
                       window: int) -> float:
    """Peak memory in MiB of `window` steps of one variant (run in a fresh process)."""
    device = torch.device(device_name)
    before = _reset_peak_rss_kib()
    with tempfile.TemporaryDirectory() as tmp:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        loop = (BaselineLoop(size, depth, batch_size, 0, device) if variant == "a" else
                stabexp_run(variant, size, depth, batch_size, 0, device.type, Path(tmp)))
        # Steps every-1, every, ...: the window holds a probe step of the default schedule.
        first = ProbeConfig().every - 1
        for i in range(first, first + window):
            loop.step(i)
        if device.type == "cuda":
            return torch.cuda.max_memory_allocated() / 2 ** 20
        return (_peak_rss_kib() - before) / 1024


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak_rss_kib() -> int:
    """Reset the peak-RSS mark to the current RSS (Linux: write 5 to /proc/self/clear_refs),
    so that imports' transient peaks do not hide the variant's; return the current RSS."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _proc_status_kib("VmRSS")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _peak_rss_kib() -> int:
    try:
        return _proc_status_kib("VmHWM")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def measure_memory(variant: str, size: str, depth: int, batch_size: int, device: torch.device,
                   window: int) -> float:
    cmd = [sys.executable, "-m", "stabexp.bench", "--memory-child", variant, size, str(depth),
           str(batch_size), device.type, str(window)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def run_bench(sizes, depths, steps, repeats, batch_size, memory: bool, out: Path) -> Dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for size in sizes:
        for depth in depths:
            t0 = time.perf_counter()
            speed = measure_speed(size, depth, steps, repeats, batch_size, device)
            mem = {v: measure_memory(v, size, depth, batch_size, device, window=3)
                   for v in variant_names()} if memory else {}
            for v in variant_names():
                rows.append({"size": size, "depth": depth, "variant": v, **speed[v],
                             "peak_mib": mem.get(v),
                             "mem_vs_b": mem[v] / mem[probes_off(v)] if mem else None})
            print(f"# {size} {depth}L-{depth}L measured in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    report = {"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "batch_size": batch_size, "seq_len": 10, "steps_per_window": steps,
              "repeats": repeats, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def format_table(report: Dict) -> str:
    """Markdown: one row per size, depth and variant, with probe overheads against b."""
    lines = [f"device {report['device']}, torch {report['torch']}, {report['threads']} threads, "
             f"batch {report['batch_size']} x {report['seq_len']} tokens, medians over "
             f"{report['repeats']} interleaved windows of {report['steps_per_window']} steps "
             f"(10 for c)",
             "", "| size | depth | variant | steps/s | speed vs a | probe cost vs b | peak MiB | memory vs b |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        cost = f"{r['probe_cost']:+.1%}" if r["variant"] != "a" else "-"
        mem = f"{r['peak_mib']:.0f}" if r["peak_mib"] is not None else "-"
        mem_ratio = f"{r['mem_vs_b']:.2f}" if r["mem_vs_b"] is not None and r["variant"] != "a" else "-"
        lines.append(f"| {r['size']} | {r['depth']} | {r['variant']} | {r['steps_per_s']:.2f} | "
                     f"{r['speed_vs_a']:.2f} | {cost} | {mem} | {mem_ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="stabexp bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="tiny,small", help="comma list of tiny, small, base")
    parser.add_argument("--depths", default="6,18,50", help="comma list of layers per stack")
    parser.add_argument("--steps", type=int, default=10,
                        help="steps per timed window (c's windows are rounded up to whole probe periods of 10)")
    parser.add_argument("--repeats", type=int, default=5, help="timed windows per variant")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default outputs/bench/bench.json)")
    parser.add_argument("--memory-child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        v, size, depth, batch, dev, window = args.memory_child
        print(_peak_memory_child(v, size, int(depth), int(batch), dev, int(window)))
        return 0
    sizes = [s for s in args.sizes.split(",") if s]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        parser.exit(2, f"stabexp bench: error: --sizes {','.join(bad)} not allowed: choose from {', '.join(SIZES)}\n")
    try:
        depths = [int(d) for d in args.depths.split(",") if d]
        assert depths and all(d >= 1 for d in depths)
    except (ValueError, AssertionError):
        parser.exit(2, f"stabexp bench: error: --depths {args.depths} not allowed: integers >= 1, comma-separated\n")
    if args.steps < 1 or args.repeats < 1 or args.batch_size < 1:
        parser.exit(2, "stabexp bench: error: --steps, --repeats and --batch-size must be >= 1\n")
    out = args.out or outputs_dir() / "bench" / "bench.json"
    report = run_bench(sizes, depths, args.steps, args.repeats, args.batch_size, not args.no_memory, out)
    print(format_table(report))
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
