"""Peak memory of this process: torch.cuda's allocator peak on a GPU, the peak resident set
(VmHWM, Linux) on the CPU. `reset` starts a new high-water mark, so that a run (or a benchmark
variant) measures itself, not what the process did before it."""

from __future__ import annotations

import resource
from pathlib import Path

import torch


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss_kib() -> int:
    """Reset the peak-RSS mark to the current RSS (Linux: write 5 to /proc/self/clear_refs), so
    that earlier transient peaks (imports, an earlier job of a sweep) do not hide this one's;
    return the current RSS in KiB."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _proc_status_kib("VmRSS")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def peak_rss_kib() -> int:
    try:
        return _proc_status_kib("VmHWM")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    reset_peak_rss_kib()


def peak_mib(device: torch.device) -> float:
    """Since the last `reset`: the CUDA allocator's peak on a GPU, else the process's peak RSS
    (everything the process holds: Python, the data, the model, its activations)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    return peak_rss_kib() / 1024
