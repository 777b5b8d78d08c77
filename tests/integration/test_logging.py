"""The project's log4j2 configuration on a real TorchServe: in force, in the right folder, bounded, and rolling.

Each test starts its own classifier-only server (a few seconds), so its log folder holds only its own traffic."""

import gzip
import json
import re
import time

import requests

from scripts.ops.server import REPO, START_LOG, log_config_path, read_properties
from scripts.reliability.logs import logs_check
from scripts.reliability.references import reference_for

LOG4J = REPO / "config" / "log4j2.xml"


def post(server, body, content_type="application/json"):
    return requests.post(
        f"{server.inference_url}/predictions/classifier",
        data=body,
        headers={"Content-Type": content_type, **server.headers("inference")},
        timeout=60,
    )


def test_project_log_config_is_in_force(start_ts_server, model_store):
    server = start_ts_server(models=["classifier"], name="logging")
    assert log_config_path(read_properties(server.config_path)) == LOG4J
    start_log = server.log_dir / START_LOG
    for name in ("ts_log.log", "model_log.log", "access_log.log", START_LOG):
        assert (server.log_dir / name).is_file(), f"{name} is not in the server's own log folder {server.log_dir}"
    start_text = start_log.read_text()
    assert "Model server started." in start_text and "Inference API bind to" in start_text
    # TorchServe's own configuration also writes a config dump, worker lines and access lines to stdout.
    assert not re.search(r" (MODEL_LOG|ACCESS_LOG|org\.pytorch\.serve\.wlm\.\w+) - ", start_text)

    # Good, malformed-JSON and invalid bodies: measured and judged by the reliability check itself.
    row = logs_check(server, reference_for("classifier", model_store, 200), 400, clients=4)
    assert row.passed, row.figure
    assert row.details["good"]["bytes_by_file"].keys() == {"access_log.log"}, row.details["good"]
    assert row.details["bad"]["tracebacks"] == 0 and row.details["bad"]["requests"] == 200


def test_logs_roll_and_stay_under_their_cap(start_ts_server, tmp_path):
    """A copy of the shipped configuration with a tiny size: old lines are dropped, the total stays capped."""
    size, rolled = 4096, 2
    text = LOG4J.read_text()
    text, changes = re.subn(r'(<Property name="max_file_size">)[^<]+(<)', rf"\g<1>{size // 1024} KB\g<2>", text)
    text, more = re.subn(r'(<Property name="max_rolled_files">)[^<]+(<)', rf"\g<1>{rolled}\g<2>", text)
    assert changes == more == 1, "config/log4j2.xml no longer sets the sizes in one place"
    tiny = tmp_path / "log4j2-tiny.xml"
    tiny.write_text(text)
    server = start_ts_server(
        models=["classifier"], name="logging-roll", overrides={"vmargs": f"-Dlog4j.configurationFile={tiny}"}
    )
    body = json.dumps({"inputs": [0.25] * 128})
    sent = 300  # ~90 bytes of access log each: ~27 KB, far past 3 x 4 KB
    for _ in range(sent):
        assert post(server, body).status_code == 200

    # log4j gzips a rolled file in the background: wait until no uncompressed one is left.
    deadline = time.time() + 30
    while any(server.log_dir.glob("access_log.*.log")) and time.time() < deadline:
        time.sleep(0.2)
    files = sorted(server.log_dir.glob("access_log*"))
    names = {f.name for f in files}
    assert {"access_log.log", "access_log.1.log.gz", "access_log.2.log.gz"} <= names, names
    assert not any(re.fullmatch(r"access_log\.[3-9]\d*\.log(\.gz)?", n) for n in names), names
    # A file rolls when an event would take it past the size: at most one line over, per file.
    line_bytes = 200
    assert sum(f.stat().st_size for f in files) <= (1 + rolled) * (size + line_bytes)
    kept = (server.log_dir / "access_log.log").read_text().splitlines()
    for gz in server.log_dir.glob("access_log.*.log.gz"):
        with gzip.open(gz, "rt") as rolled_file:
            kept += rolled_file.read().splitlines()
    posts = [line for line in kept if '"POST /predictions/classifier' in line]
    assert 0 < len(posts) < sent, "the oldest lines must have been dropped, the newest kept"
