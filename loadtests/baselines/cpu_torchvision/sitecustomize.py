"""A workaround that lets the CUDA-only torchvision wheel import on the project's CPU torch, for the stock
image_classifier baseline only (loadtests/baselines/stock_image_classifier.py puts this folder on that server's
PYTHONPATH; nothing else sees it).

The only torchvision for torch 2.13 on the package index (0.28.0, manylinux x86_64) is a CUDA build: its compiled
ops library (_C.so) links libtorch_cuda, so it does not load against CPU torch. torchvision itself copes with that
(its ops then raise "Couldn't load custom C++ ops" when called), except that _meta_registrations.py registers fake
kernels for ``torchvision::nms`` and ``qnms`` without checking, which fails the whole ``import torchvision`` with
"operator torchvision::nms does not exist". This declares those two operator schemas (no kernel: nms still cannot
run) just before torchvision is first imported, so the fake-kernel registration has something to attach to.

The stock handler's path uses no torchvision compiled op: VisionHandler decodes with PIL, and image_classifier's
transforms (Resize 256, CenterCrop 224, ToTensor, Normalize) are PIL and torch. What it computes is unchanged.
"""

import importlib.abc
import sys

# The schemas torchvision's _C declares for them (as _meta_registrations.py's fake kernels take them).
TORCHVISION_OPS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_libraries = []  # a torch.library.Library's definitions live as long as the object: keep it


class DeclareTorchvisionOps(importlib.abc.MetaPathFinder):
    """Runs once, at the first ``import torchvision``, so that processes that never import it (the TorchServe
    launcher) do not pay for importing torch; then leaves the import to the normal finders."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            import torch.library

            library = torch.library.Library("torchvision", "FRAGMENT")
            for schema in TORCHVISION_OPS:
                library.define(schema)
            _libraries.append(library)
        return None


sys.meta_path.insert(0, DeclareTorchvisionOps())
