"""Tasks: what the trainer asks for batches, losses and evaluation (data/task.py).

- sort (the default) and reverse: sequences of symbols sorted or reversed, generated in-process
  from the seed (data/symbols.py);
- teacher: classification by a random teacher (the SMD study's normalised network);
- translation: parallel text from a folder, or a corpus downloaded on first use (multi30k);
- lm: language modelling on English text (built in, or a folder), for the single-stack models.

TASKS maps each task kind to its factory (cfg, device) -> Task, which declares the model archs
it trains (`archs`). It is the package's entry point of the stabexp.tasks group: `task.kind`
is looked up through stabexp.plugins, which also finds the tasks of other packages and a
user's Task subclass named by a dotted path (`as_task_factory`; docs/plugins.md).
"""

from typing import Callable, Optional

from stabexp import plugins
from stabexp.config import SUBWORDS
from stabexp.data.symbols import SYMBOL_TASKS, ReverseTask, SortTask, SymbolTask
from stabexp.data.task import Task
from stabexp.data.teacher import TeacherTask
from stabexp.errors import ConfigError, need


def trains(*archs: str, check: Optional[Callable] = None) -> Callable:
    """Mark a task factory with the model.arch values it trains (a task's `archs`) and the check
    of its own task keys (`check(cfg)`, raising ConfigError; config.validate calls it)."""
    def mark(factory: Callable) -> Callable:
        factory.archs = archs
        factory.check = check
        return factory
    return mark


def check_translation(cfg) -> None:
    from stabexp.data.download import CORPORA

    t = cfg.task
    need(bool(t.path) or bool(t.download) or bool(t.hf_dataset), "task.path", t.path,
         "needs a folder holding {split}.{lang} files (or task.download, or task.hf_dataset)")
    need(not t.hf_dataset or not (t.path or t.download), "task.hf_dataset", t.hf_dataset,
         "takes the corpus from the Hugging Face dataset: leave task.path and task.download empty")
    need(not t.download or t.download in CORPORA, "task.download", t.download,
         f"one of {', '.join(CORPORA)} (or empty, with task.path)")
    need(t.src_lang != t.tgt_lang, "task.tgt_lang", t.tgt_lang, "must differ from task.src_lang")
    need(t.subword in SUBWORDS, "task.subword", t.subword, f"one of {', '.join(SUBWORDS)}")
    for key in ("max_len", "beam", "max_len_b"):
        need(t[key] >= 1, f"task.{key}", t[key], "must be an integer >= 1")
    need(t.max_len_a >= 0, "task.max_len_a", t.max_len_a, "must be >= 0")
    need(t.bleu_sentences >= 0, "task.bleu_sentences", t.bleu_sentences, "must be >= 0 (0: all)")


def check_language_model(cfg) -> None:
    need(cfg.task.subword in (*SUBWORDS, "char"), "task.subword", cfg.task.subword,
         f"one of {', '.join(SUBWORDS)}, char")


def _sizes(cfg) -> dict:
    t = cfg.task
    return {"batch_size": cfg.train.batch_size, "eval_batch_size": t.eval_batch_size,
            "probe_batch_size": t.probe_batch_size, "label_smoothing": cfg.train.label_smoothing}


def _symbols(task_class) -> Callable:
    @trains("transformer")
    def make(cfg, device) -> Task:
        return task_class(cfg.task.vocab_size, cfg.task.seq_len, cfg.seed, device, **_sizes(cfg))
    return make


@trains("normmlp")
def _teacher(cfg, device) -> Task:
    t = cfg.task
    return TeacherTask(t.in_dim, t.classes, cfg.seed, device, t.label_noise, **_sizes(cfg))


@trains("transformer", check=check_translation)
def _translation(cfg, device) -> Task:
    from stabexp.data.translation import TranslationTask

    return TranslationTask(cfg, device)


@trains("decoder_only", "encoder_only", check=check_language_model)
def _language_model(cfg, device) -> Task:
    from stabexp.data.lm import LanguageModelTask

    return LanguageModelTask(cfg, device)


TASKS = {**{kind: _symbols(task_class) for kind, task_class in SYMBOL_TASKS.items()},
         "teacher": _teacher, "translation": _translation, "lm": _language_model}
KINDS = tuple(TASKS)  # the built-in task kinds


def as_task_factory(obj) -> Callable:
    """What a task kind or dotted path may lead to (stabexp.plugins): a Task subclass whose
    constructor takes (cfg, device), or a factory (cfg, device) -> Task; either names the
    model.arch values it trains in `archs` (a class attribute, or set by `trains`)."""
    if (isinstance(obj, type) and not issubclass(obj, Task)) or not callable(obj):
        raise plugins.Rejected(f"it is {plugins.what_is(obj)}, not a Task subclass or a factory (cfg, device) -> Task")
    if not plugins.takes(obj, "cfg", "device"):
        raise plugins.Rejected("it is a task that cannot be made as task(cfg, device)")
    archs = getattr(obj, "archs", ())
    if not archs or isinstance(archs, str) or not all(isinstance(a, str) for a in archs):
        raise plugins.Rejected("it is a task that names no model archs it trains: give it archs = ('transformer',) "
                               "(or decoder_only, encoder_only, normmlp)")
    return obj


def make_task(cfg, device) -> Task:
    """The task a run's config describes (cfg.task, with the batch settings of cfg.train)."""
    task = plugins.task_factory(cfg.task.kind)(cfg, device)
    if not isinstance(task, Task):
        raise ConfigError(f"task.kind={cfg.task.kind} is not allowed: it made {plugins.what_is(task)}, not a Task")
    return task


def prepare(cfg) -> None:
    """Everything a run of this config needs on disk before it starts (the corpus, the subword
    vocabulary), so that bad data stops a sweep before any run folder exists."""
    if cfg.task.kind == "translation":
        from stabexp.data.translation import load_corpus

        load_corpus(cfg.task)
    if cfg.task.kind == "lm":
        import torch

        from stabexp.data.lm import LanguageModelTask

        LanguageModelTask(cfg, torch.device("cpu"))


__all__ = ["ReverseTask", "SortTask", "SymbolTask", "TeacherTask", "Task", "TASKS", "KINDS", "make_task", "prepare",
           "trains", "as_task_factory"]
