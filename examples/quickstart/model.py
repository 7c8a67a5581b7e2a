"""The quick start's model: a small classifier over 64 features, with random weights
(gatekeeper seeds the factory, so every process builds the same model)."""

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self, d_in: int = 64, d_hidden: int = 256, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.head = nn.Linear(d_hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.fc1(x))
        h = nn.functional.gelu(self.fc2(h))
        return self.head(h)


def make() -> nn.Module:
    return Classifier()
