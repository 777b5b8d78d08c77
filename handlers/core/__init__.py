"""What every handler shares: the batch orchestration (``base``), HTTP body handling (``http``), per-request errors
(``errors``), the ``handler:`` config schema (``config``), metrics (``metrics``), device/precision/compile choices
(``runtime``), the CPU flags they read and the kind of CPU a process runs as (``cpu``), worker logging rules
(``logging_setup``), returning freed memory (``memory``), how large one answer may be (``answer_size``), the
worker's start in phases (``load_phases``), the content digest that names what a model computes (``identity``)
and the fixes the installed TorchServe frontend carries (``frontend_jar``)."""
