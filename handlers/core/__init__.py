"""What every handler shares: the batch orchestration (``base``), HTTP body handling (``http``), per-request errors
(``errors``), the ``handler:`` config schema (``config``), metrics (``metrics``), device/precision/compile choices
(``runtime``), the CPU flags they read and the kind of CPU a process runs as (``cpu``), worker logging rules
(``logging_setup``) and returning freed memory (``memory``)."""
