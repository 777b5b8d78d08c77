"""A team's own PyTorch network, served batched: the engine and its request dialects, in process (no TorchServe here).

Design. A network arrives as a ``torch.export`` program (``torch.export.save``; later also TorchScript or model code
with weights). Everything a server needs to know about it is read from the program itself (``signature``): each
input's and output's name, dtype and shape, which dimensions are dynamic and within what range, which integer inputs
index an embedding. A small optional signature file adds only what the program cannot say (id ranges, class labels,
inputs that may hold NaN, an example request, row limits). Requests come in the Open Inference Protocol v2 (JSON or
Triton's binary extension: ``oip``, framing in ``binary``; datatypes in ``datatypes``) or in a short native JSON form
for curl; either way they become wire tensors, which the engine checks one request at a time against the signature
(``inputs``: a bad request is refused alone, naming its input), then batches: requests of equal sizes beyond the rows
are concatenated and computed together, in passes of bounded rows, and each answer is sliced back out (``engine``).

What computes the program (``backends``): eager, or a compiled candidate built at package time from the exported
program (AOTInductor, OpenVINO; torch.compile at load), at fp32 or bf16 where the CPU has it natively, each gated
against eager per output (fp32 within 1e-5 relative, integer outputs exactly) and ranked by speed by
scripts/build_backends.py; a worker serves the recorded winner through :func:`backends.load_served` (eager fp32 with
the reason where it cannot load here) and describes it with ``Served.describe``. docs/performance.md, "Networks:
backends".

Import direction: handlers.core <- handlers.network (datatypes <- signature <- inputs <- engine, oip, backends);
nothing here imports another model family.
"""
