"""Synthetic tasks generated in-process from the seed (no downloads)."""

from stabexp.data.reverse import ReverseTask
from stabexp.data.teacher import TeacherTask


def make_task(task_cfg, seed: int, device):
    """The task a run's `task` config describes."""
    if task_cfg.name == "teacher":
        return TeacherTask(task_cfg.in_dim, task_cfg.classes, seed, device, task_cfg.label_noise)
    return ReverseTask(task_cfg.vocab_size, task_cfg.seq_len, seed, device)


__all__ = ["ReverseTask", "TeacherTask", "make_task"]
