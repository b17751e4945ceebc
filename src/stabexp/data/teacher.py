"""Classification by a fixed random teacher: the task of the SMD study's normalised network.

Inputs are standard Gaussian vectors; the label is the argmax of a random two-layer ReLU
teacher's outputs, with a fraction of labels flipped at random so the gradient never vanishes
(the equilibrium of spherical motion dynamics needs gradient noise that does not die out).
Batches have the (inputs, unused, targets) shape of the seq2seq tasks, with one position.
"""

from __future__ import annotations

import math

import torch

from stabexp.data.streams import Batch, SeededStreams
from stabexp.data.task import to_device


class TeacherTask(SeededStreams):
    def __init__(self, in_dim: int, classes: int, seed: int, device: torch.device, label_noise: float = 0.1,
                 **sizes):
        super().__init__(seed, **sizes)
        self.in_dim, self.classes, self.device, self.label_noise = in_dim, classes, device, label_noise
        self.vocab_size = classes
        teacher = torch.Generator().manual_seed(10_000 + seed)
        self.w1 = torch.randn(in_dim, 4 * in_dim, generator=teacher) / math.sqrt(in_dim)
        self.w2 = torch.randn(4 * in_dim, classes, generator=teacher) / math.sqrt(4 * in_dim)

    @property
    def chance_loss(self) -> float:
        return math.log(self.classes)

    def _make(self, n: int, gen: torch.Generator) -> Batch:
        x = torch.randn(n, 1, self.in_dim, generator=gen)
        y = (torch.relu(x @ self.w1) @ self.w2).argmax(-1)
        flip = torch.rand(n, 1, generator=gen) < self.label_noise
        y = torch.where(flip, torch.randint(0, self.classes, (n, 1), generator=gen), y)
        x, y = to_device(x, self.device), to_device(y, self.device)
        return x, x, y  # the second slot is unused by NormMLP
