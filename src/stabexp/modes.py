"""The one way the code switches a model between training and eval mode for a block and puts
it back as it was, whatever happens inside."""

from __future__ import annotations

from contextlib import contextmanager

import torch.nn as nn


@contextmanager
def in_mode(model: nn.Module, training: bool, only_if_dropout: bool = False):
    """`model` in training (True) or eval mode inside the block, as it was after it.
    only_if_dropout: leave the modules alone when the model has no dropout (`config.dropout`
    0), where the two modes compute the same thing: setting the mode of every module costs more
    than a probe's own arithmetic in a deep tiny model."""
    was_training = model.training
    switch = was_training != training and not (only_if_dropout and getattr(getattr(model, "config", None),
                                                                            "dropout", 0) == 0)
    if switch:
        model.train(training)
    try:
        yield model
    finally:
        if switch:
            model.train(was_training)


def eval_mode(model: nn.Module, only_if_dropout: bool = False):
    """The model in eval mode (no dropout) inside the block, as it was after it."""
    return in_mode(model, False, only_if_dropout)


def train_mode(model: nn.Module):
    """The model in training mode inside the block, as it was after it."""
    return in_mode(model, True)
