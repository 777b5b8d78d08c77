"""TorchServe's BaseHandler on the network comparison's TorchScript trace: the stock handler with the three methods a
user overrides for tensor inputs, nothing else.

TorchServe 0.12's stock ``BaseHandler`` loads the archive's serialized ``.pt`` with ``torch.jit.load`` and runs
``model(torch.as_tensor(data))`` on the list of requests it is handed, which cannot work for JSON bodies (a list of
``{"body": {...}}`` dicts) nor for a network of several inputs. So, as TorchServe's docs direct, this subclass keeps
``initialize`` (the TorchScript load, device choice) and ``handle`` (the timing metrics) and overrides only:

- ``preprocess``: each request's JSON ``{input: nested rows}`` to arrays, the batch's requests concatenated by rows
  (input names and dtypes from the folder's network.json, packed as an extra file);
- ``inference``: ``model(*inputs)`` under inference mode (the stock one passes a single tensor);
- ``postprocess``: the output split back per request, each answered ``{output: nested rows}``.
"""

import json
import os

import numpy as np
import torch
from ts.torch_handler.base_handler import BaseHandler

DTYPES = {"float32": np.float32, "int64": np.int64}


class NetworkTensorHandler(BaseHandler):
    def initialize(self, context):
        super().initialize(context)
        model_dir = context.system_properties.get("model_dir")
        with open(os.path.join(model_dir, "network.json"), encoding="utf-8") as described:
            network = json.load(described)
        self.input_specs = [(spec["name"], DTYPES[spec["datatype"]]) for spec in network["inputs"]]
        self.output_name = network["outputs"][0]["name"]
        self.rows = []

    def preprocess(self, data):
        bodies = []
        for request in data:
            body = request.get("data") or request.get("body")
            bodies.append(json.loads(body) if isinstance(body, (bytes, bytearray)) else body)
        first = self.input_specs[0][0]
        self.rows = [len(body[first]) for body in bodies]
        # Through numpy: torch.as_tensor walks a nested list element by element (seconds for one 224x224 image).
        return [
            torch.from_numpy(np.concatenate([np.asarray(body[name], dtype=dtype) for body in bodies]))
            for name, dtype in self.input_specs
        ]

    def inference(self, data, *args, **kwargs):
        with torch.inference_mode():
            return self.model(*data)

    def postprocess(self, data):
        return [{self.output_name: part.tolist()} for part in torch.split(data, self.rows)]
