"""Tiny networks exported with torch.export, saved and loaded back as a team would hand them over, for the network
engine's tests (tests/unit/test_network_*.py). Each is exported once per session (the first export of a session
costs ~2 s of torch's own warm-up, each later one a fraction of a second)."""

import functools
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.export import Dim, export

from handlers.network import signature as network_signature

SAVED = Path(tempfile.mkdtemp(prefix="network-programs-"))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.layers(x)


class Ranker(nn.Module):
    """Integer item ids into an embedding, float features beside them: one score per row."""

    def __init__(self):
        super().__init__()
        self.items = nn.Embedding(40, 8)
        self.head = nn.Linear(8 + 5, 1)

    def forward(self, item_ids, features):
        return self.head(torch.cat([self.items(item_ids), features], dim=1)).squeeze(1)


class Sequence(nn.Module):
    """Tokens and a mask of one dynamic length: a pooled vector and a value per token."""

    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(20, 8)
        self.pool = nn.Linear(8, 4)
        self.per_token = nn.Linear(8, 2)

    def forward(self, tokens, mask):
        hidden = self.tokens(tokens) * mask.unsqueeze(-1)
        pooled = self.pool(hidden.sum(1) / mask.sum(1, keepdim=True).clamp(min=1))
        return pooled, self.per_token(hidden)


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(3, 5)
        self.classes = nn.Linear(5, 4)

    def forward(self, x):
        embedding = torch.tanh(self.body(x))
        return {"logits": self.classes(embedding), "embedding": embedding}


class Classes(nn.Module):
    """Scores and the index of the best one: an integer output beside a float one."""

    def __init__(self):
        super().__init__()
        self.scores = nn.Linear(4, 6)

    def forward(self, x):
        scores = self.scores(x)
        return {"scores": scores, "best": scores.argmax(dim=1)}


def seeded(module_class):
    torch.manual_seed(0)
    return module_class().eval()


def save_and_load(name, program):
    """Through torch.export.save / load, as the engine receives a program."""
    path = SAVED / f"{name}.pt2"
    torch.export.save(program, str(path))
    return torch.export.load(str(path))


@functools.cache
def exported(name):
    """(the eager module, the loaded ExportedProgram) for one of the networks below."""
    batch = Dim("batch", max=64)
    if name == "mlp":
        module = seeded(MLP)
        program = export(module, (torch.randn(3, 6),), dynamic_shapes={"x": {0: batch}})
    elif name == "mlp_min3":  # exported for at least 3 rows: smaller passes are padded
        module = seeded(MLP)
        program = export(module, (torch.randn(4, 6),), dynamic_shapes={"x": {0: Dim("batch", min=3, max=64)}})
    elif name == "mlp_batch1":  # exported without dynamic_shapes: specialised to one row
        module = seeded(MLP)
        program = export(module, (torch.randn(1, 6),))
    elif name == "ranker":
        module = seeded(Ranker)
        example = (torch.randint(0, 40, (3,)), torch.randn(3, 5))
        program = export(module, example, dynamic_shapes={"item_ids": {0: batch}, "features": {0: batch}})
    elif name == "sequence":
        module = seeded(Sequence)
        length = Dim("length", min=2, max=32)
        example = (torch.randint(0, 20, (3, 7)), torch.ones(3, 7))
        shapes = {"tokens": {0: batch, 1: length}, "mask": {0: batch, 1: length}}
        program = export(module, example, dynamic_shapes=shapes)
    elif name == "two_heads":
        module = seeded(TwoHeads)
        program = export(module, (torch.randn(3, 3),), dynamic_shapes={"x": {0: batch}})
    elif name == "classes":
        module = seeded(Classes)
        program = export(module, (torch.randn(3, 4),), dynamic_shapes={"x": {0: batch}})
    else:
        raise KeyError(name)
    return module, save_and_load(name, program)


def signature_of(name, settings=None):
    return network_signature.from_exported(exported(name)[1], settings)


def program_of(name):
    return exported(name)[1].module()
