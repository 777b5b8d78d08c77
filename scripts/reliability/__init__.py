"""Reliability suite: correctness under concurrency, bad input, overload, worker failure, security, memory.

Run it with `make reliability` (full) or `python -m scripts.reliability --help`; `make test` runs a short form.
"""
