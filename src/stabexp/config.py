"""The config schema: every key a run accepts, with its type and default.

Registered in Hydra's ConfigStore as `stabexp_schema`; conf/config.yaml puts it first in its
defaults list, so an unknown key or a value of the wrong type is rejected when Hydra composes.
Ranges that a type cannot express (depth >= 1, lr > 0, ...) are checked by `validate`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from stabexp.errors import ConfigError, need  # noqa: F401  (also stabexp.config.ConfigError)
from stabexp.model_options import NORMS, ModelOptions
from stabexp.paths import outputs_dir


def with_defaults(cfg: DictConfig) -> DictConfig:
    """A run's saved config.yaml on today's schema: keys added since it was written take their
    defaults, so older run folders still build their model (`stabexp export`)."""
    schema = OmegaConf.structured(Config(group=GroupConfig(), model=ModelConfig(), task=TaskConfig(),
                                         optim=OptimConfig()))
    return OmegaConf.merge(schema, cfg)


def resolved(cfg: DictConfig, leave_out=("logger",)) -> dict:
    """The resolved config as plain containers, without the keys that say how a run is handled
    rather than what it computes (`logger`: where it is watched; `overwrite`: what to do with
    its folder)."""
    plain = OmegaConf.to_container(cfg, resolve=True)
    for key in leave_out:
        plain.pop(key, None)
    return plain


def model_norm(cfg) -> str:
    """The norm kind the model is built with: the group's own (group.norm) or model.norm."""
    return cfg.group.norm or cfg.model.norm


def placements(cfg) -> set:
    """The residual placements of the model's stacks (a stack's own, else group.residual)."""
    return {cfg.group[f"{stack}_residual"] or cfg.group.residual for stack in ("encoder", "decoder")}


def run_name(overrides) -> str:
    """A folder name made from a job's overrides, so that re-running the same command (or the
    same sweep) finds the same folder. Hydra gives the overrides as `key=value` strings."""
    # `overwrite` says what to do with the folder, so it must not change which folder it is.
    # Nor do the trackers a run is watched in (`logger=...`): adding TensorBoard to a finished
    # sweep's command finds the same folders.
    parts = sorted(str(o) for o in overrides
                   if not str(o).lstrip("+~").startswith(("hydra", "overwrite=", "logger=", "logger.")))
    # Quotes of quoted values would end the quoted hydra.sweep.dir the CLI passes to Hydra.
    exact = "__".join(parts).replace("'", "").replace('"', "")
    name = exact.replace("/", "-").replace(" ", "") or "default"
    import hashlib

    if name != exact:  # `task.path=/x/a-b` and `task.path=/x/a/b` read alike: the hash tells them apart
        name = name[:120] + "__" + hashlib.sha1(exact.encode()).hexdigest()[:10]
    elif len(name) > 150:  # keep under file-system limits, stay deterministic
        name = name[:120] + "__" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return name


def by_scale(scale: str, default, quick, paper=None):
    """`${by_scale:${scale},DEFAULT,QUICK[,PAPER]}` in a preset: its value at each scale
    (conf/scale); a preset without a PAPER value runs its DEFAULT one at scale=paper."""
    if scale == "quick":
        return quick
    return paper if scale == "paper" and paper is not None else default


# Resolvers used by conf/config.yaml's hydra section and the presets; registered once at import.
if not OmegaConf.has_resolver("stabexp_outputs"):
    OmegaConf.register_new_resolver("stabexp_outputs", lambda: str(outputs_dir()))
    OmegaConf.register_new_resolver("stabexp_run_name", run_name)
    OmegaConf.register_new_resolver("by_scale", by_scale)


# --- schema --------------------------------------------------------------------------------

SCHEDULES = ("constant", "warmup_inverse_sqrt", "inverse_sqrt_nowarmup", "warmup_linear_decay")
# transformer: the encoder-decoder; decoder_only / encoder_only: one stack (model/lm.py).
ARCHS = ("transformer", "decoder_only", "encoder_only", "normmlp")
# Which archs a task trains, and whether an init rule's constants exist for an encoder-decoder
# only (T-Fixup's encoder and decoder factors), the task and the rule say themselves, built-in
# or plug-in: `archs` of a task factory (data/__init__.py), `encoder_decoder_only` of a rule
# (model/init.py); stabexp.plugins finds them.
SUBWORDS = ("bpe", "unigram")  # and char, for task=lm
PRECISIONS = ("fp32", "bf16")
DECAY_ON = ("matrices", "all")  # optim.decay_on: the matrices (and embeddings) only, or every parameter


@dataclass
class GroupConfig:
    """A control group: a residual style, an init rule and an lr schedule (conf/group/*.yaml)."""

    name: str = MISSING
    description: str = ""      # one line for `stabexp list`
    citation: str = ""         # paper (and section) the group reproduces
    residual: str = MISSING    # a placement's name (model/placements.py PLACEMENTS) or a dotted
                               # path to one of your own (docs/plugins.md)
    # An encoder-decoder's stack with a placement of its own (Admin's hybrid table: a Post-LN
    # encoder under a Pre-LN decoder, and the reverse); null: `residual`.
    encoder_residual: Optional[str] = None
    decoder_residual: Optional[str] = None
    init: str = MISSING        # an init rule's name (model/init.py INIT_RULES) or a dotted path
    schedule: str = MISSING    # one of SCHEDULES; see train/schedule.py
    norm: Optional[str] = None  # the group's own norm kind in place of model.norm (group dyt:
                               # DyT in a Pre-LN model); null: model.norm
    mix_ratio: float = 0.25    # residual mix_ln only: the share a of the layers, the bottom floor(a L),
                               # that are Post-LN (Li et al. 2024; 0.25 in the authors' scripts)


@dataclass(kw_only=True)
class _ModelChoice:
    name: str = MISSING
    arch: str = "transformer"  # transformer: encoder-decoder (model/transformer.py); decoder_only
                               # or encoder_only: one stack of `depth` layers (model/lm.py);
                               # normmlp (model/normmlp.py)


@dataclass(kw_only=True)
class ModelConfig(ModelOptions, _ModelChoice):
    """The model (conf/model/*.yaml): which one, then its options (stabexp.model_options, the
    fields the model itself reads). Depth is the top-level `depth`."""


@dataclass
class TaskConfig:
    """The task (conf/task/*.yaml): synthetic (sort, reverse, teacher), generated in-process from the
    seed, or translation of parallel text (data/translation.py)."""

    name: str = MISSING
    kind: str = MISSING        # sort | reverse | teacher | translation | lm: the task class
                               # (data/__init__.py)
    vocab_size: int = 16       # sort, reverse: symbols incl. BOS (chance ln(vocab_size - 1));
                               # translation: size of the joint subword vocabulary to learn
    seq_len: int = 10          # sort, reverse: source and target length; lm: tokens per window
    eval_batch_size: int = 256  # sort, reverse: the fixed held-out batch; translation: sentences per
                               # batch when scoring and translating the validation / test split
    probe_batch_size: int = 32  # fixed batch x of the model update F(x, theta_i) (translation:
                               # the first validation pairs)
    classes: int = 10          # teacher: classes (chance loss ln(classes))
    in_dim: int = 32           # teacher: input features
    label_noise: float = 0.1   # teacher: fraction of labels drawn at random
    mask_prob: float = 0.15    # lm with model.arch=encoder_only: masked-LM positions (BERT)
    # translation: files {path}/{split}.{lang}[.gz], one sentence per line; lm: {path}/{split}.txt
    path: Optional[str] = None  # the corpus folder; null: the cached download of `download`
                               # (lm: the built-in text, Python's pydoc_data topics)
    download: str = ""         # a corpus fetched into $STABEXP_DATA on first use (multi30k)
    url: str = ""              # where `download` comes from; empty: its public home
    src_lang: str = "de"
    tgt_lang: str = "en"
    train_split: str = "train"
    valid_split: str = "valid"
    test_split: str = "test"
    max_len: int = 128         # subwords per side: longer training pairs are dropped, longer
                               # validation / test sides cut
    subword: str = "bpe"       # bpe | unigram (sentencepiece), learned jointly on the train split;
                               # lm also char (characters)
    bleu_sentences: int = 0    # validation pairs (the first n) translated for valid_bleu; 0: all
    beam: int = 1              # 1: greedy decoding; > 1: beam search of that width
    max_len_a: float = 1.2     # decoding stops a sentence at max_len_a * source length (EOS
    max_len_b: int = 10        # included) + max_len_b tokens, as fairseq's --max-len-a/-b
    bleu: bool = True          # false: no valid_bleu and no test translations (losses only),
                               # for runs too short or too big for decoding to mean anything
    # translation from a Hugging Face dataset (the `datasets` package, the hf extra;
    # data/hf.py): its splits are written as {split}.{lang} files once and then
    # read like task.path. A hub id, or a folder saved with Dataset(Dict).save_to_disk.
    hf_dataset: str = ""
    hf_config: Optional[str] = None    # the dataset's configuration (wmt14: de-en); null: its default
    hf_revision: Optional[str] = None  # a commit of the hub repository (pinned by the presets)


@dataclass
class OptimConfig:
    """The optimiser (conf/optim/*.yaml)."""

    name: str = MISSING         # adam (coupled L2 decay), adamw, adamw_independent, radam, sgd,
                                # sgdm or muon (Muon + AdamW): train/optim.py
    betas: List[float] = field(default_factory=lambda: [0.9, 0.98])  # adam, adamw, radam, muon's AdamW
    eps: float = 1e-8           # adam, adamw, radam, muon's AdamW
    momentum: float = 0.0       # sgdm, muon
    weight_decay: float = 0.0   # lambda, PyTorch's convention for each optimiser
    decay_on: str = "matrices"  # matrices (and embeddings) only, or all parameters


PARALLEL = ("none", "ddp", "fsdp")  # train.parallel: one process, DDP, FSDP2 (stabexp.distributed)


@dataclass
class TrainConfig:
    steps: int = 600            # optimiser steps
    # Peak lr. 1e-3 rather than DeepNet's 5e-4: at 5e-4 the tiny 18L-18L Post-LN model still
    # learns without warm-up on the default task (README, "What it shows").
    lr: float = 1e-3
    warmup_steps: int = 100     # linear warm-up length, for schedules that warm up
    decay_period: int = 4000    # inverse_sqrt_nowarmup (T-Fixup): lr sqrt(D / (D + t)), D this
    warmup_init_lr: Optional[float] = None  # the lr of the first update, fairseq's
                                # --warmup-init-lr (DeepNet Table 4: 1e-7); null: the warm-up
                                # starts at lr / warmup_steps (train/schedule.py)
    schedule: str = "group"     # the group's lr schedule, or one of SCHEDULES to override it
    batch_size: int = 64        # sentences per batch; translation: at most so many (0: no limit,
                                # with max_tokens), fairseq's --batch-size
    max_tokens: int = 0         # translation: padded tokens per batch at most, fairseq's
                                # --max-tokens; batches are length-bucketed either way
    # Batches per optimiser step, their gradients added up (fairseq's --update-freq): a step
    # of update_freq batches at the memory of one, its loss the mean over all their tokens.
    # The schedule, the probes and the checkpoints count optimiser steps.
    update_freq: int = 1
    label_smoothing: float = 0.0  # of the training loss (0.1 in the translation studies)
    clip_norm: float = 0.0      # total grad-norm clipping; 0 = off (as in the studies)
    z_loss: float = 0.0         # coefficient of the mean (log Z)^2 added to the training loss
                                # (PaLM; Wortsman et al. 2023 use 1e-4); 0 = off
    eval_every: int = 100       # eval loss / accuracy on the held-out batch every so many steps
    explode_factor: float = 4.0  # loss > this x max(chance loss, first loss) counts as diverged
    # Step hooks of other packages (entry point group stabexp.step_hooks) or dotted paths
    # module.Class, called after the built-ins at each moment (train/hooks.py, docs/plugins.md).
    hooks: List[str] = field(default_factory=list)
    device: str = "auto"        # auto (cuda when present), cpu or cuda
    threads: int = 0            # torch intra-op threads; 0 = torch's default
    precision: str = "fp32"     # fp32, or bf16: the training forward and loss under bf16
                                # autocast (weights, optimiser and every probe stay fp32)
    compile: bool = False       # wrap the training forward in torch.compile (README, "GPU")
    # A checkpoint every so many steps (and whenever the process is asked to stop), from which
    # the same command resumes (train/checkpoint.py); 0: only when asked to stop.
    checkpoint_every: int = 200
    save_model: bool = False    # keep the final weights in the run folder (model.pt), for
                                # `stabexp export` and your own analysis
    # Keep only each layer's input in the training forward and recompute the layer in the
    # backward pass (torch.utils.checkpoint): activation memory of one layer instead of all,
    # for one more forward per step. The same numbers either way (docs/scale.md).
    activation_checkpointing: bool = False
    # QK-Clip's tau (Kimi K2, train/qk_clip.py): after each step, the W_q, W_k of every head
    # whose largest logit of the step exceeded tau are scaled so it would be tau (Kimi K2: 100);
    # 0 = off.
    qk_clip_tau: float = 0.0
    # One model on K processes (stabexp.distributed, docs/scale.md), launched by torchrun or
    # srun: none (one process), ddp (DistributedDataParallel: every rank holds the model) or
    # fsdp (FSDP2's fully_shard per layer: parameters, gradients and optimiser state sharded).
    parallel: str = "none"


@dataclass
class ProbeConfig:
    enabled: bool = True        # false: no model update / per-layer rows (loss and eval only)
    every: int = 10             # write metrics/layers rows every so many steps
    first_steps: int = 20       # ... and at every step up to this one (early training)
    log_every: int = 100        # log line every so many steps when stderr is not a terminal
    # Before training: Admin's output change and the gradient at init (probes/at_init.py),
    # written into the step-0 rows. With train.steps=0 a run measures only this.
    at_init: bool = False
    perturbation_draws: int = 1  # at_init: Admin's delta drawn so many times, changes averaged
    grad_batches: int = 1       # at_init: batches the gradient at init is averaged over (norms
                                # per batch, then the mean); 0: no gradient at init
    # Norm, angular update and effective lr of every weight matrix (probes/weights.py) in the
    # layers rows of each probe step, plus which weights are scale-invariant.
    weights: bool = False
    # Admin's residual dependency (probes/dependency.py): each sublayer's output decomposed
    # into the embedding and every earlier branch, into dependency.csv at init and at the end.
    dependency: bool = False
    # The eval-loss increase of skipping each layer (probes/layer_importance.py), into
    # layer_importance.csv at init and at the end: one eval pass per layer each time.
    layer_importance: bool = False
    # DeepNet's Theorem 4.1 (one stack) / 4.3 (encoder-decoder) bound on the model update
    # (probes/update_bound.py), per sublayer at each probe step, into update_bound.csv: Post-LN
    # and DeepNorm placements only.
    update_bound: bool = False
    # DeepNet's Lemma 1 (probes/attention_mixing.py): each attention's output magnitude against
    # its values', into attention_mixing.csv at init and at the end.
    attention_mixing: bool = False
    # Each sublayer's ||W_t - W_0|| / ||W_0|| (probes/init_distance.py) in layers.csv at the probe
    # steps; keeps a copy of the weights at init (in the checkpoints too).
    init_distance: bool = False
    # Probes of one's own or of another package (docs/probes.md), by registered name or dotted
    # path module.Class: each a stabexp.probes.base.Probe, run beside the built-ins above.
    extra: List[str] = field(default_factory=list)


@dataclass
class TensorBoardLogger:
    """logger=tensorboard: event files, one folder per run under one log dir per sweep."""

    dir: Optional[str] = None  # the log dir; null: `tensorboard/` beside the run folders (the
                               # sweep folder, or outputs/runs for single runs)


@dataclass
class MlflowLogger:
    """logger=mlflow: one MLflow experiment per sweep, one MLflow run per job."""

    tracking_uri: Optional[str] = None  # null: $MLFLOW_TRACKING_URI, else sqlite:///<outputs>/mlflow.db
    experiment: Optional[str] = None    # null: the sweep folder's name (outputs/runs: "runs")


@dataclass
class WandbLogger:
    """logger=wandb: one W&B run per job, grouped per sweep; offline where no network."""

    project: str = "stabexp"
    entity: Optional[str] = None
    group: Optional[str] = None  # null: the sweep folder's name
    mode: Optional[str] = None   # online, offline or disabled; null: $WANDB_MODE, else online
                                 # when api.wandb.ai answers within 2 s, offline otherwise
    dir: Optional[str] = None    # where W&B writes its run files; null: `wandb/` beside the run folders


@dataclass
class LoggerConfig:
    """Trackers a run also logs to (conf/logger; several at once: logger=[tensorboard,mlflow]).
    The CSV files and summary.json stay the record; a tracker's failure is a warning."""

    tensorboard: Optional[TensorBoardLogger] = None
    mlflow: Optional[MlflowLogger] = None
    wandb: Optional[WandbLogger] = None


@dataclass
class Config:
    group: GroupConfig = MISSING
    model: ModelConfig = MISSING
    task: TaskConfig = MISSING
    optim: OptimConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    depth: int = 18                     # N: encoder layers (and decoder layers unless set)
    decoder_depth: Optional[int] = None  # M, when it differs from N
    seed: int = 0                       # fixes init, data and probe batch
    overwrite: bool = False             # re-run a folder that already holds a finished run
    experiment: str = ""                # preset this run belongs to (conf/experiment sets it)
    scale: str = "default"              # preset scale, default, quick or paper: set by conf/scale, read
                                        # by the presets' ${by_scale:${scale},DEFAULT,QUICK[,PAPER]}


def register_configs() -> None:
    ConfigStore.instance().store(name="stabexp_schema", node=Config)
    # The packed launcher's config node (hydra/launcher=packed, the default), stored when its
    # module is imported: Hydra's scan of hydra_plugins misses an editable install's folder.
    import hydra_plugins.stabexp_launcher.conf  # noqa: F401


register_configs()


# --- checks a type cannot express ----------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _schema() -> DictConfig:
    """The schema with every group filled in, so that its keys can be listed; built once (it is
    most of a validation's time otherwise) and read-only."""
    schema = OmegaConf.structured(Config(group=GroupConfig(), model=ModelConfig(),
                                         task=TaskConfig(), optim=OptimConfig(),
                                         logger=LoggerConfig(TensorBoardLogger(), MlflowLogger(), WandbLogger())))
    OmegaConf.set_readonly(schema, True)
    return schema


def unknown_key_message(key: str) -> str:
    """'unknown key ...' naming what the nearest known parent of `key` accepts."""
    schema = _schema()
    parts = key.split(".")
    node, known_path = schema, []
    for part in parts[:-1]:
        child = node.get(part) if isinstance(node, DictConfig) else None
        if not isinstance(child, DictConfig):
            break
        node, known_path = child, known_path + [part]
    where = f"'{'.'.join(known_path)}'" if known_path else "the top level"
    return f"unknown key '{key}': {where} accepts {', '.join(sorted(node.keys()))}"


def _check_known_keys(cfg: DictConfig, schema: DictConfig, prefix: str = "") -> None:
    # Hydra lets `+key=value` add keys even to a structured config; the schema does not.
    for key in cfg.keys():
        if key not in schema.keys():
            raise ConfigError(unknown_key_message(prefix + str(key)))
        child, child_schema = cfg.get(key), schema.get(key)
        if isinstance(child, DictConfig) and isinstance(child_schema, DictConfig):
            _check_known_keys(child, child_schema, f"{prefix}{key}.")


def _check_set(cfg: DictConfig, prefix: str = "") -> None:
    # A config file of the user's own (a group without `init`, say) leaves a mandatory key
    # unset, which would surface only as OmegaConf's traceback once the model is built.
    for key in cfg.keys():
        if OmegaConf.is_missing(cfg, key):
            group = prefix.rstrip(".")
            named = group and key != "name" and "name" in cfg and not OmegaConf.is_missing(cfg, "name")
            source = (f"the {group} file {cfg.name}.yaml" if named else f"the {group} file" if group
                      else "the config")
            raise ConfigError(f"{prefix}{key} has no value: {source} must set it")
        if isinstance(cfg.get(key), DictConfig):
            _check_set(cfg.get(key), f"{prefix}{key}.")


def _check_finite(cfg: DictConfig, prefix: str = "") -> None:
    # inf and nan pass every `> 0` or `>= 0` check below, and would only show as a run that
    # "diverges" at step 1: a non-finite number is bad input wherever it appears.
    for key in cfg.keys():
        value = cfg.get(key)
        if isinstance(value, DictConfig):
            _check_finite(value, f"{prefix}{key}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}{key}={value} is not allowed: it must be a finite number")


def validate_world(cfg: DictConfig, world: int, grouped: bool) -> None:
    """What a run on `world` processes (in a process group or not, stabexp.distributed) needs of
    the config, checked on every rank alike, so all of them stop with the same line."""
    tr = cfg.train
    need(grouped or tr.parallel == "none", "train.parallel", tr.parallel,
          "needs a process group: torchrun --nproc-per-node=K -m stabexp run ... (or K srun tasks); "
          "one process runs with train.parallel=none")
    need(world == 1 or tr.parallel != "none", "train.parallel", tr.parallel,
          f"must be ddp or fsdp on {world} processes (with none each would train a model of its own)")
    fixed = cfg.task.kind != "translation" or tr.max_tokens == 0
    need(not fixed or tr.batch_size % world == 0, "train.batch_size", tr.batch_size,
          f"must be a multiple of the {world} processes (each trains on an equal share of every batch)")


def _tasks_of_arch(arch: str) -> List[str]:
    """The registered task kinds that train model.arch `arch` (for messages)."""
    from stabexp import plugins

    return [kind for kind, task in plugins.registered("task").items() if arch in getattr(task, "archs", ())]


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError with one line naming the bad value and what is allowed. Placements,
    init rules, tasks, optimisers and probes are resolved through stabexp.plugins, so a user's
    plug-in (a dotted path, another package's entry point) is imported and checked here, before
    a run starts; a task kind and a probe check their own keys (`check`)."""
    _check_known_keys(cfg, _schema())
    _check_set(cfg)
    _check_finite(cfg)
    # The run's random streams are seeded 4 seed + k (torch takes seeds below 2^64).
    need(0 <= cfg.seed < 2 ** 60, "seed", cfg.seed, "must be an integer in [0, 2^60)")
    need(cfg.depth >= 1, "depth", cfg.depth, "must be an integer >= 1")
    if cfg.decoder_depth is not None:
        need(cfg.decoder_depth >= 1, "decoder_depth", cfg.decoder_depth,
              "must be an integer >= 1 (or null for decoder_depth = depth)")
    _check_group(cfg)
    _check_model(cfg)
    _check_task(cfg)
    _check_optim(cfg)
    _check_train(cfg)
    _check_probes(cfg)


def _check_group(cfg: DictConfig) -> None:
    """The placements and init rule, and whether they fit the model's stacks."""
    from stabexp import plugins

    m, g = cfg.model, cfg.group
    need(m.arch in ARCHS, "model.arch", m.arch, f"one of {', '.join(ARCHS)}")
    rule = plugins.check("init", g.init, "group.init")
    if m.arch in ("decoder_only", "encoder_only"):
        need(cfg.decoder_depth is None, "decoder_depth", cfg.decoder_depth,
              f"model.arch={m.arch} has one stack of `depth` layers (leave decoder_depth null)")
        need(not getattr(rule, "encoder_decoder_only", False), "group.init", g.init,
              f"its constants are defined for an encoder-decoder only (model.arch=transformer), "
              f"not for model.arch={m.arch}")
    plugins.check("placement", g.residual, "group.residual")
    for key in ("encoder_residual", "decoder_residual"):
        if g[key] is not None:
            plugins.check("placement", g[key], f"group.{key}")
            need(m.arch == "transformer", f"group.{key}", g[key],
                  f"a placement per stack needs the encoder-decoder (model.arch=transformer), "
                  f"not model.arch={m.arch}")
    for placement in sorted(placements(cfg)):
        need(m.arch != "transformer" or plugins.placement(placement).encoder_decoder, "group.residual", placement,
              f"its paper defines it for decoder-only LMs: model.arch=decoder_only (or encoder_only), "
              f"not the encoder-decoder (group={g.name})")
    need(0.0 <= g.mix_ratio <= 1.0, "group.mix_ratio", g.mix_ratio, "must be in [0, 1]")
    need(g.schedule in SCHEDULES, "group.schedule", g.schedule, f"one of {', '.join(SCHEDULES)}")
    need(g.init not in ("admin_profiled", "admin_closed_form") or placements(cfg) == {"admin"}, "group.init",
          g.init, f"{g.init} sets Admin's omegas, so it needs group.residual=admin in every stack")


def _check_model(cfg: DictConfig) -> None:
    from stabexp import plugins

    m, g = cfg.model, cfg.group
    for key in ("dyt_alpha", "dyt_alpha_attn", "dyt_alpha_ffn", "dyt_alpha_final"):
        need(m[key] is None or m[key] > 0, f"model.{key}", m[key], "must be > 0 (or null for the per-site keys)")
    need(m.norm in NORMS, "model.norm", m.norm, f"one of {', '.join(NORMS)}")
    need(g.norm is None or g.norm in NORMS, "group.norm", g.norm, f"one of {', '.join(NORMS)} (or null)")
    norm, norm_key = model_norm(cfg), "group.norm" if g.norm else "model.norm"
    for placement in sorted(placements(cfg)):
        need(norm == "layernorm" or plugins.placement(placement).has_norm, norm_key, norm,
              f"group.residual={placement} has no normalisation to replace (layernorm only)")
    for key in ("d_model", "ffn_dim", "n_heads"):
        need(m[key] >= 1, f"model.{key}", m[key], "must be an integer >= 1")
    need(m.d_model % m.n_heads == 0, "model.n_heads", m.n_heads, f"must divide model.d_model={m.d_model}")
    need(0.0 <= m.dropout < 1.0, "model.dropout", m.dropout, "must be in [0, 1)")


def _check_task(cfg: DictConfig) -> None:
    """The keys every task reads, then the task kind's own (its factory's `check`)."""
    from stabexp import plugins

    t, m = cfg.task, cfg.model
    task = plugins.check("task", t.kind, "task.kind")
    need(m.arch in task.archs, "task", t.name,
          f"model.arch={m.arch} trains on tasks of kind {', '.join(_tasks_of_arch(m.arch))}")
    need(t.vocab_size >= 3, "task.vocab_size", t.vocab_size, "must be >= 3")
    for key in ("seq_len", "eval_batch_size", "probe_batch_size", "classes", "in_dim"):
        need(t[key] >= 1, f"task.{key}", t[key], "must be an integer >= 1")
    need(0.0 <= t.label_noise <= 1.0, "task.label_noise", t.label_noise, "must be in [0, 1]")
    need(0.0 < t.mask_prob < 1.0, "task.mask_prob", t.mask_prob, "must be in (0, 1)")
    if getattr(task, "check", None) is not None:
        task.check(cfg)


def _check_optim(cfg: DictConfig) -> None:
    from stabexp import plugins

    o = cfg.optim
    factory = plugins.check("optimiser", o.name, "optim.name")
    need(0.0 <= o.momentum < 1.0, "optim.momentum", o.momentum, "must be in [0, 1)")
    need(o.decay_on in DECAY_ON, "optim.decay_on", o.decay_on, f"one of {', '.join(DECAY_ON)}")
    need(len(o.betas) == 2 and all(0.0 <= b < 1.0 for b in o.betas), "optim.betas",
          list(o.betas), "two numbers in [0, 1)")
    need(o.eps > 0, "optim.eps", o.eps, "must be > 0")
    need(o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, "must be >= 0")
    if getattr(factory, "check", None) is not None:  # the optimiser's own rules
        factory.check(cfg)


def _check_train(cfg: DictConfig) -> None:
    tr, t = cfg.train, cfg.task
    need(tr.steps >= 0, "train.steps", tr.steps, "must be an integer >= 0 (0 = probes at init only)")
    need(tr.lr > 0, "train.lr", tr.lr, "must be > 0")
    need(tr.warmup_steps >= 0, "train.warmup_steps", tr.warmup_steps, "must be >= 0")
    need(tr.decay_period >= 1, "train.decay_period", tr.decay_period, "must be an integer >= 1")
    if tr.warmup_init_lr is not None:
        need(tr.warmup_steps >= 1, "train.warmup_steps", tr.warmup_steps,
              "must be >= 1 with train.warmup_init_lr (the warm-up goes from it to train.lr)")
        need(0.0 <= tr.warmup_init_lr <= tr.lr, "train.warmup_init_lr", tr.warmup_init_lr,
              f"must be in [0, train.lr={tr.lr}] (or null)")
    need(tr.schedule in ("group", *SCHEDULES), "train.schedule", tr.schedule,
          f"one of group, {', '.join(SCHEDULES)}")
    need(tr.batch_size >= 1 or (tr.batch_size == 0 and tr.max_tokens > 0), "train.batch_size", tr.batch_size,
          "must be an integer >= 1 (0, no limit, only with train.max_tokens)")
    need(tr.update_freq >= 1, "train.update_freq", tr.update_freq,
         "must be an integer >= 1 (batches per optimiser step; 1: no accumulation)")
    need(tr.max_tokens == 0 or t.kind == "translation", "train.max_tokens", tr.max_tokens,
          "a token budget needs variable-length batches: task of kind translation (or 0)")
    need(tr.max_tokens == 0 or tr.max_tokens > t.max_len, "train.max_tokens", tr.max_tokens,
          f"must be 0 or above task.max_len={t.max_len}, so every kept pair fits a batch")
    need(0.0 <= tr.label_smoothing < 1.0, "train.label_smoothing", tr.label_smoothing, "must be in [0, 1)")
    for key in ("clip_norm", "z_loss", "qk_clip_tau"):
        need(tr[key] >= 0, f"train.{key}", tr[key], "must be >= 0 (0 = off)")
    need(tr.parallel in PARALLEL, "train.parallel", tr.parallel, f"one of {', '.join(PARALLEL)}")
    need(tr.eval_every >= 1, "train.eval_every", tr.eval_every, "must be an integer >= 1")
    need(tr.explode_factor > 1, "train.explode_factor", tr.explode_factor, "must be > 1")
    need(tr.device in ("auto", "cpu", "cuda"), "train.device", tr.device, "one of auto, cpu, cuda")
    need(tr.threads >= 0, "train.threads", tr.threads, "must be >= 0 (0 = torch default)")
    need(tr.precision in PRECISIONS, "train.precision", tr.precision, f"one of {', '.join(PRECISIONS)}")
    need(tr.checkpoint_every >= 0, "train.checkpoint_every", tr.checkpoint_every,
          "must be an integer >= 0 (0: only when the process is asked to stop)")


def _check_probes(cfg: DictConfig) -> None:
    """When the probes run, then each probe the config turns on checks what it needs
    (`Probe.check`, stabexp.probes.base)."""
    from stabexp import plugins

    p = cfg.probe
    need(p.every >= 1, "probe.every", p.every, "must be an integer >= 1")
    need(p.first_steps >= 0, "probe.first_steps", p.first_steps, "must be >= 0")
    need(p.log_every >= 1, "probe.log_every", p.log_every, "must be an integer >= 1")
    for probe in plugins.probes(cfg):
        probe.check(cfg)
