"""Tasks: what the trainer asks for batches, losses and evaluation (data/task.py).

- sort (the default) and reverse: sequences of symbols sorted or reversed, generated in-process
  from the seed (data/symbols.py);
- teacher: classification by a random teacher (the SMD study's normalised network);
- translation: parallel text from a folder, or a corpus downloaded on first use (multi30k);
- lm: language modelling on English text (built in, or a folder), for the single-stack models.
"""

from stabexp.data.symbols import SYMBOL_TASKS, ReverseTask, SortTask, SymbolTask
from stabexp.data.task import Task
from stabexp.data.teacher import TeacherTask

KINDS = (*SYMBOL_TASKS, "teacher", "translation", "lm")


def make_task(cfg, device) -> Task:
    """The task a run's config describes (cfg.task, with the batch settings of cfg.train)."""
    t = cfg.task
    if t.kind == "translation":
        from stabexp.data.translation import TranslationTask

        return TranslationTask(cfg, device)
    if t.kind == "lm":
        from stabexp.data.lm import LanguageModelTask

        return LanguageModelTask(cfg, device)
    sizes = {"batch_size": cfg.train.batch_size, "eval_batch_size": t.eval_batch_size,
             "probe_batch_size": t.probe_batch_size, "label_smoothing": cfg.train.label_smoothing}
    if t.kind == "teacher":
        return TeacherTask(t.in_dim, t.classes, cfg.seed, device, t.label_noise, **sizes)
    return SYMBOL_TASKS[t.kind](t.vocab_size, t.seq_len, cfg.seed, device, **sizes)


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


__all__ = ["ReverseTask", "SortTask", "SymbolTask", "TeacherTask", "Task", "KINDS", "make_task", "prepare"]
