"""The networks' PyTorch definitions (loadtests/networks.py describes them, builds their folders and says which is
which): a ResNet-50 of plain torch layers and a small ranker, each built with seeded random weights, and the wrappers
that are exported (named inputs, the output under its name)."""

from __future__ import annotations

import torch
from torch import nn

from loadtests.networks import SEED


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride here, as torchvision's v1.5), 1x1 expand by 4, plus the shortcut."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int):
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000, depths: tuple[int, ...] = (3, 4, 6, 3)):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks: list[nn.Module] = []
        channels = 64
        for stage, depth in enumerate(depths):
            width = 64 * 2**stage
            for index in range(depth):
                blocks.append(Bottleneck(channels, width, 2 if index == 0 and stage > 0 else 1))
                channels = width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(images))), 1))


class Ranker(nn.Module):
    """Embedding tables and an MLP: one score per (request, candidate item)."""

    def __init__(self, users: int = 10_000, items: int = 50_000, width: int = 32, features: int = 16):
        super().__init__()
        self.users = nn.Embedding(users, width)
        self.items = nn.Embedding(items, width)
        self.context = nn.Linear(features, width)
        self.mlp = nn.Sequential(nn.Linear(3 * width, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, user_id: torch.Tensor, item_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        candidates = item_ids.shape[1]
        user = self.users(user_id).expand(-1, candidates, -1)  # user_id is [rows, 1]: [rows, 1, width]
        context = torch.relu(self.context(features)).unsqueeze(1).expand(-1, candidates, -1)
        joined = torch.cat([user, self.items(item_ids), context], dim=2)
        return self.mlp(joined).squeeze(2)


class NamedLogits(nn.Module):
    """The CNN as exported: its argument named as the input, its tensor under the output's name, so that every
    OIP server (and this project's engine, which reads names from the program) names them alike."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.module(images)}


class NamedScores(nn.Module):
    """The ranker as exported (see NamedLogits)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, user_id: torch.Tensor, item_ids: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"scores": self.module(user_id, item_ids, features)}


def calibrate_batch_norms(module: nn.Module, example: tuple[torch.Tensor, ...]) -> None:
    """Running statistics from one pass over random input (cumulative average), so that a randomly initialised deep
    network keeps activations of unit scale in eval mode instead of growing by orders of magnitude per stage."""
    norms = [layer for layer in module.modules() if isinstance(layer, nn.BatchNorm2d)]
    for layer in norms:
        layer.reset_running_stats()
        layer.momentum = None
    module.train()
    with torch.no_grad():
        module(*example)
    module.eval()


def make_resnet() -> nn.Module:
    torch.manual_seed(SEED)
    module = ResNet50()
    calibrate_batch_norms(module, (torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(SEED)),))
    return module.eval()


def make_ranker() -> nn.Module:
    torch.manual_seed(SEED)
    return Ranker().eval()


MAKERS = {"resnet50-size": make_resnet, "ranking": make_ranker}
NAMED = {"resnet50-size": NamedLogits, "ranking": NamedScores}
