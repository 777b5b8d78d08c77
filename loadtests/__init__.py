"""Load tests, capacity search, batch-config tuning and side-by-side comparison of the served models.

Entry points (each an argparse CLI with --help; the Makefile wraps them):
    python -m loadtests.run        one Locust profile against a server -> loadtests/reports/<model>-<profile>-<time>/
    python -m loadtests.capacity   highest open-loop arrival rate whose p99 stays within an SLO
    python -m loadtests.tune       batchSize x maxBatchDelay (x workers) sweep, each point a capacity search
    python -m loadtests.compare    this project vs naive TorchServe, Flask, Ray Serve and the in-process ceiling
"""
