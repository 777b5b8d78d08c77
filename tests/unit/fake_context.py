"""A real ts.context.Context built without a server, for calling handlers directly in unit tests."""

from pathlib import Path

import yaml
from ts.context import Context, RequestProcessor


def make_context(model_dir, model_name="test-model", headers=None, batch_size=None, version="1.0"):
    """Context as TorchServe builds it: model dir, manifest, the archive's model-config.yaml, request headers."""
    model_dir = Path(model_dir)
    config_file = model_dir / "model-config.yaml"
    yaml_config = yaml.safe_load(config_file.read_text()) if config_file.exists() else {}
    context = Context(model_name, str(model_dir), {"model": {"modelName": model_name, "modelVersion": version}},
                      batch_size or yaml_config.get("batchSize", 1), None, "0.12.0", model_yaml_config=yaml_config)
    set_requests(context, headers or [{}])
    return context


def set_requests(context, headers):
    """One RequestProcessor per request of the next batch, carrying that request's headers."""
    context.request_processor = [RequestProcessor(dict(h)) for h in headers]
    return context


def statuses(context, count):
    return [context.get_response_status(idx)[0] or 200 for idx in range(count)]
