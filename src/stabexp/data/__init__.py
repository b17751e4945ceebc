"""Synthetic tasks generated in-process from the seed (no downloads)."""

from stabexp.data.reverse import ReverseTask

TASKS = {"reverse": ReverseTask}

__all__ = ["ReverseTask", "TASKS"]
