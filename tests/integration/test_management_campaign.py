"""The management-API campaign's short form on the session's server (the full form, every model scaled to 0 and back
over three rounds, is `make reliability`): every call TorchServe 0.12 offers, good and bad parameters, sent raw while
each served model is under load; afterwards every model answers with its own answer and no worker restarted that a
call did not stop (scripts/reliability/management.py)."""

from pathlib import Path

import pytest

from scripts.reliability import management


def test_the_management_campaign_leaves_every_model_serving(ts_server):
    served = [name for name in management.BODIES if f"{name}.mar" in ts_server.props.get("load_models", "")]
    if "classifier" not in served:
        pytest.skip("the campaign registers a copy of classifier.mar: not served by this session (TS_TEST_MODELS)")
    rows = management.campaign(ts_server, served, Path(ts_server.props["model_store"]), rounds=1, clients=2)
    failed = [f"{row.check}: {row.figure} {row.details}" for row in rows if not row.passed]
    assert not failed, "\n".join(failed)
