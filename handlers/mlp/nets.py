"""The classifier's network and how it is loaded from the archive (kept apart: a handler module may define only one
class)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from handlers.core.base import Loaded


class MLPClassifier(nn.Module):
    """The seeds' classifier: Linear(in, hidden) -> GELU -> Linear(hidden, classes)."""

    def __init__(self, in_features: int = 128, hidden: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(in_features, hidden), nn.GELU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, torch.Tensor]) -> MLPClassifier:
        """Rebuild with the sizes the weights carry, so a retrained model of other sizes loads too."""
        hidden, in_features = state_dict["layers.0.weight"].shape
        classes = state_dict["layers.2.weight"].shape[0]
        model = cls(in_features, hidden, classes)
        model.load_state_dict(state_dict)
        return model


@dataclass
class LoadedClassifier(Loaded):
    in_features: int  # values per input row


def load_classifier(model_dir: str, weights: str) -> LoadedClassifier:
    """The fp32 classifier from its state_dict file in the archive (weights only: never a pickled object)."""
    state_dict = torch.load(os.path.join(model_dir, weights), map_location="cpu", weights_only=True)
    model = MLPClassifier.from_state_dict(state_dict)
    return LoadedClassifier(model=model, in_features=int(state_dict["layers.0.weight"].shape[1]))
