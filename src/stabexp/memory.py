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


def reset(device: torch.device) -> float:
    """Start a new peak; return what the process holds now (MiB; on a GPU, the allocator's)."""
    rss_kib = reset_peak_rss_kib()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device) / 2 ** 20
    return rss_kib / 1024


def peak_mib(device: torch.device) -> float:
    """Since the last `reset`: the CUDA allocator's peak on a GPU, else the process's peak RSS
    (everything the process holds: Python, the data, the model, its activations)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    return peak_rss_kib() / 1024


# --- will a run's batch fit? ---------------------------------------------------------------

def available_bytes(device: torch.device) -> int:
    """Memory a run may still take: the GPU's free memory, or the host's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    available = _meminfo_bytes("MemAvailable")
    return available if available is not None else 1 << 62  # not known here: no refusal


def _meminfo_bytes(field: str):
    """A field of /proc/meminfo in bytes (None where there is none: not Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def stack_depths(cfg):
    """(layers of the first stack, of the decoder stack): depth and decoder_depth (default:
    depth) for the encoder-decoder, (depth, 0) for a single stack."""
    if cfg.model.arch != "transformer":
        return cfg.depth, 0
    return cfg.depth, cfg.decoder_depth or cfg.depth


def least_step_bytes(cfg) -> int:
    """A lower bound on the memory of one training step's batch, where the task fixes the
    batch's shape (sort, reverse, teacher, lm: train.batch_size rows of task.seq_len tokens;
    a translation batch is what the corpus gives, at most train.batch_size sentences, so no
    bound): the fp32 activations the backward pass must keep of each layer (its input, the
    attention output and the FFN's hidden layer: d + d + ffn per token, far below all it keeps)
    and the logits with their gradient. A run that needs more than this cannot run; one that
    needs less may still not."""
    kind, t = cfg.task.kind, cfg.task
    if kind in ("sort", "reverse", "lm"):
        return _kept_bytes(cfg, cfg.train.batch_size * (t.seq_len + 1), t.vocab_size)
    if kind == "teacher":
        return _kept_bytes(cfg, cfg.train.batch_size, t.classes)
    return 0


def _kept_bytes(cfg, tokens: int, outputs: int) -> int:
    """The fp32 activations kept of each layer for `tokens` tokens, and the logits with their gradient."""
    m = cfg.model
    per_token = sum(stack_depths(cfg)) * (2 * m.d_model + m.ffn_dim) + 2 * outputs
    return 4 * tokens * per_token


def least_model_bytes(cfg, world: int = 1) -> int:
    """A lower bound on what one training process keeps of the model: its fp32 weights and their
    gradients (8 bytes a parameter of `parameters`, the norms' and biases' vectors and any
    optimiser state left out), a 1/`world` share of them under FSDP2, which shards both."""
    shards = world if cfg.train.get("parallel", "none") == "fsdp" else 1
    return 8 * parameters(cfg) // shards


def check_fits(cfg, device: torch.device, world: int = 1) -> None:
    """ConfigError when one step cannot fit in the memory left (least_model_bytes, the model's
    weights and gradients, and least_step_bytes, the batch's activations), before anything is
    built: a model or a batch far too big is one line, not a process the kernel kills when it
    has taken the machine's memory from every other job on it. `world`: the processes that
    share each batch."""
    import os

    from stabexp.errors import ConfigError

    # K processes share each batch: a GPU holds its rank's share, a host its ranks' shares.
    sharing = 1 if device.type == "cuda" else int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    batch = least_step_bytes(cfg) * sharing // world
    model = least_model_bytes(cfg, world) * sharing
    need, free = batch + model, available_bytes(device)
    if need <= free:
        return
    where = "this GPU" if device.type == "cuda" else "this machine"
    gib = 2 ** 30
    if model >= batch:
        depths = "/".join(str(n) for n in stack_depths(cfg) if n)
        raise ConfigError(f"depth={cfg.depth} is not allowed here: a model of {depths} layers at d_model="
                          f"{cfg.model.d_model} has about {parameters(cfg):.3g} parameters, whose weights and "
                          f"gradients alone need {model / gib:.1f} GiB (with the batch's activations "
                          f"{need / gib:.1f} GiB, a lower estimate), and {where} has {free / gib:.1f} GiB free: "
                          "lower depth or model.d_model (or shard it: train.parallel=fsdp)")
    raise ConfigError(f"train.batch_size={cfg.train.batch_size} is not allowed here: one step of it needs at "
                      f"least {need / gib:.1f} GiB (its activations and logits, {batch / gib:.1f} GiB, and the "
                      f"model's weights and gradients, {model / gib:.1f} GiB; a lower estimate) and {where} has "
                      f"{free / gib:.1f} GiB free: lower train.batch_size (or task.seq_len)")


# --- how much a run will take, for packing a sweep's jobs (stabexp.sweep) -------------------

BASE_BYTES = 450 * 2 ** 20  # Python, torch and the data of a tiny run (lm_depth's 6-layer runs peak at 450 MiB)


def parameters(cfg) -> int:
    """The model's parameter count from its shape (embeddings, attention and FFN matrices; the
    norms' and biases' vectors left out)."""
    m, d = cfg.model, cfg.model.d_model
    encoder_layers, decoder_layers = stack_depths(cfg)
    vocab = cfg.task.classes + cfg.task.in_dim if cfg.task.kind == "teacher" else cfg.task.vocab_size
    encoder = encoder_layers * (4 * d * d + 2 * d * m.ffn_dim)
    decoder = decoder_layers * (8 * d * d + 2 * d * m.ffn_dim)  # self- and cross-attention
    return vocab * d * (2 if decoder_layers else 1) + encoder + decoder


def run_bytes(cfg) -> int:
    """An estimate of a run's peak memory, on the high side, for deciding how many runs share a
    machine: the process's base, 16 bytes a parameter (the weights, their gradient, Adam's two
    moments; the probes' copies of the weights add to it) and 8 x the least activation memory
    of a step (least_step_bytes, a lower bound: the 1,000-layer runs of deepnet_1000_layers and
    lm_1000_layers peaked at 6.6 and 5 times it, docs/data/deepnet_cells.csv; a translation batch
    under a token budget: budget_step_bytes)."""
    return BASE_BYTES + 16 * parameters(cfg) + 8 * (least_step_bytes(cfg) or budget_step_bytes(cfg))


def budget_step_bytes(cfg) -> int:
    """What least_step_bytes counts, for a translation batch as full as its token budget lets it
    be (train.max_tokens padded tokens on each side, stabexp.data.batching): not a bound below
    (a batch may be less full), but the size such a run's steps come close to. Without it the
    18L-18L, d = 512 runs of deepnet_early_paper were counted at 2.5 GiB, packed two on a
    24 GiB machine, and peaked at 12.3-12.9 GiB each (2026-12-05); 0 without a token budget."""
    if cfg.task.kind != "translation" or cfg.train.max_tokens <= 0:
        return 0
    return _kept_bytes(cfg, cfg.train.max_tokens, cfg.task.vocab_size)


def total_bytes() -> int:
    """The machine's memory (MemTotal), the same from one launch of a sweep to the next."""
    total = _meminfo_bytes("MemTotal")
    if total is not None:
        return total
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62
