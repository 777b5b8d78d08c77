"""Handler for every team's own network packaged from its folder (models/network-model): a ``torch.export`` program,
asked in the Open Inference Protocol v2 (tritonclient), the native JSON form, or through the archive's own
``handler.py`` hooks. Everything is the one network path, :class:`handlers.network.handler.NetworkHandler`."""

from __future__ import annotations

from handlers.network.handler import NetworkHandler


class NetworkModelHandler(NetworkHandler):
    pass
