"""Load shapes (one LoadTestShape per module, so a run names exactly one with ``-f locustfile.py,shapes/X.py``)."""
