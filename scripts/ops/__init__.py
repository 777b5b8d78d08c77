"""The ops library: the one place each outside system is spoken to, used by every CLI, tool and test.

    management.py      ManagementClient: the only code that speaks TorchServe's management API
    server.py          server lifecycle: render a config, start, wait READY, status, stop (waits for exit),
                       private servers on free ports with a watchdog
    auth.py            key file and tokens
    rollout.py         register beside, wait READY, switch the default, drain, retire (scripts/modelctl.py rollout)
    model_views.py     management-API answers as rows and lines for people (modelctl list/describe)
    stats.py           the one percentile definition
    payloads.py        the one random-text generator
    machine.py         cores and CPU flags of the machine a measurement ran on
    handler_loader.py  load a handler in-process with overrides (benchmarks, fuzz references, cost check)
    cache_server.py    the shared embedding cache server (Valkey/Redis): find the binary, start, stop (make serve/stop,
                       tests, loadtests/cache_report.py)

Nothing here imports torch at module level: the readiness probe runs management.py inside the serving image.
"""
