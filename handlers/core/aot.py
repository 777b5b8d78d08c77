"""An AOTInductor package opened for serving, shared by every model family with prebuilt ``aot`` backends.

The text family (handlers/text/backends.py) and the network family (handlers/network/backends.py) both check a
package against this CPU (:data:`ISA_FLAGS`) and then run it through :class:`AotPackage`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# Instruction sets an AOTInductor package may have been compiled for: machine code built with one of them dies with
# SIGILL (the worker, not an exception) on a CPU without it, so a package built elsewhere is checked before loading.
ISA_FLAGS = frozenset(
    {
        "avx2",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512dq",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "avx_vnni",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    }
)


class AotPackage:
    """An AOTInductor package's compiled model, opened as ``aoti_load_package`` opens it but without two costs of
    that path (minilm's AOT fp32 worker start, 2-core EPYC with AVX2 emulated: 22 s before, 1.4 s after):

    - its device check only warns when the package's vector ISA differs from the one inductor would compile for
      here, and inductor finds that out by compiling a test program per ISA with the C++ compiler and loading each
      in a fresh Python process (16.5 s of the 22 s wherever inductor's cache dir is empty: a new machine,
      container or tmp). The callers have already compared the package's ISA flags with this CPU's;
    - torch's wrapper class lives in modules that import torch._dynamo and inductor (~1.1 s), which running a
      compiled package does not need.

    What is left is the loader torch's wrappers build (model "model", the name ``aoti_compile_and_package`` gives
    it) and their call: the arguments flattened as the program was exported (positional, then keyword), the outputs
    unflattened by the package's own spec."""

    def __init__(self, path: Path) -> None:
        from torch.utils import _pytree

        self.loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
        self.flatten = _pytree.tree_leaves
        self.unflatten = _pytree.tree_unflatten
        self.out_spec = _pytree.treespec_loads(self.loader.get_call_spec()[1])

    def __call__(self, *tensors: torch.Tensor, **keywords: torch.Tensor) -> Any:
        arguments = self.flatten((tensors, keywords)) if keywords else list(tensors)
        return self.unflatten(self.loader.boxed_run(arguments), self.out_spec)
