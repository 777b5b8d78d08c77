"""What every handler shares: the batch orchestration (``base``), HTTP body handling (``http``), per-request errors
(``errors``), the ``handler:`` config schema (``config``), metrics (``metrics``), device/precision/compile choices
(``runtime``), worker logging rules (``logging_setup``), returning freed memory (``memory``) and how large one
answer may be (``answer_size``)."""
