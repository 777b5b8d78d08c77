"""Model architectures that handlers load (kept apart: a handler module may define only one class)."""

from torch import nn


class MLPClassifier(nn.Module):
    """The seeds' classifier: Linear(in, hidden) -> GELU -> Linear(hidden, classes)."""

    def __init__(self, in_features=128, hidden=128, classes=10):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(in_features, hidden), nn.GELU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.layers(x)

    @classmethod
    def from_state_dict(cls, state_dict):
        """Rebuild with the sizes the weights carry, so a retrained model of other sizes loads too."""
        hidden, in_features = state_dict["layers.0.weight"].shape
        classes = state_dict["layers.2.weight"].shape[0]
        model = cls(in_features, hidden, classes)
        model.load_state_dict(state_dict)
        return model
