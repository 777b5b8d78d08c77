"""The shipped log4j2 configuration (config/log4j2.xml) and how every profile and deployment reaches it.

Structure only: tests/integration/test_logging.py proves on a real TorchServe that it is in force and rolls."""

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from scripts import deploy_manifests
from scripts.ops.server import LOG_CONFIG_OPTION, REPO, log_config_path, read_properties, render_config

LOG4J = REPO / "config" / "log4j2.xml"
PROFILES = [REPO / "config.properties", REPO / "config" / "production.properties"]
UNITS = {"KB": 1024, "MB": 1024**2, "GB": 1024**3}


@pytest.fixture(scope="module")
def config():
    return ET.parse(LOG4J).getroot()


def properties(config):
    return {p.get("name"): p.text for p in config.find("Properties")}


def test_every_file_log_rolls_by_size_with_a_total_cap(config):
    props = properties(config)
    size_text = props["max_file_size"]
    number, unit = re.fullmatch(r"(\d+) (KB|MB|GB)", size_text).groups()
    cap = int(number) * UNITS[unit] * (1 + int(props["max_rolled_files"]))
    assert cap <= 60 * 2**20, "each log's cap (current file + rolled ones) should stay small"
    rolling = config.find("Appenders").findall("RollingFile")
    assert {a.get("name") for a in rolling} == {"ts_log", "model_log", "access_log", "model_metrics", "ts_metrics"}
    for appender in rolling:
        assert appender.find("SizeBasedTriggeringPolicy").get("size") == "${max_file_size}"
        assert appender.find("DefaultRolloverStrategy").get("max") == "${max_rolled_files}"
        # Only an index in the rolled names: a date would make a new series (and a new cap) every day.
        assert "%i" in appender.get("filePattern") and "%d" not in appender.get("filePattern")
        assert appender.find("TimeBasedTriggeringPolicy") is None and appender.find("Policies") is None


def test_each_event_is_written_once_and_only_start_up_goes_to_stdout(config):
    loggers = config.find("Loggers")
    console = {a.get("name") for a in config.find("Appenders").findall("Console")}
    writers = {}
    for logger in loggers:
        refs = [r.get("ref") for r in logger.findall("AppenderRef")]
        if logger.tag == "Logger" and refs:
            assert logger.get("additivity") == "false", f"{logger.get('name')} would also write through root"
        assert len(refs) == len(set(refs))
        for ref in refs:
            writers.setdefault(ref, []).append(logger.get("name", "root"))
    assert all(writers[name] == ["org.pytorch.serve.ModelServer"] for name in console)
    for name in ("MODEL_LOG", "ACCESS_LOG", "MODEL_METRICS", "TS_METRICS"):
        logger = next(entry for entry in loggers if entry.get("name") == name)
        assert [r.get("ref") for r in logger.findall("AppenderRef")] != ["ts_log"]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_every_profile_uses_it_with_an_absolute_path(profile, tmp_path):
    assert log_config_path(read_properties(profile)) == Path("config/log4j2.xml")
    rendered = render_config(profile, tmp_path / "config.properties", {"model_store": str(tmp_path)})
    assert log_config_path(rendered) == LOG4J and LOG4J.is_file()
    # The other JVM options are kept as they were.
    before = [w for w in read_properties(profile)["vmargs"].split() if not w.startswith(LOG_CONFIG_OPTION)]
    after = [w for w in rendered["vmargs"].split() if not w.startswith(LOG_CONFIG_OPTION)]
    assert before == after
    assert read_properties(tmp_path / "config.properties")["vmargs"] == rendered["vmargs"]


def test_render_keeps_absolute_paths_and_urls(tmp_path):
    source = tmp_path / "in.properties"
    source.write_text("vmargs=-Xmx1g -Dlog4j.configurationFile=/etc/ts/log4j2.xml\n")
    assert render_config(source, tmp_path / "a")["vmargs"] == "-Xmx1g -Dlog4j.configurationFile=/etc/ts/log4j2.xml"
    source.write_text("vmargs=-Dlog4j.configurationFile=file:///etc/ts/log4j2.xml\n")
    assert log_config_path(render_config(source, tmp_path / "b")) == Path("/etc/ts/log4j2.xml")


def test_deployments_ship_it(tmp_path):
    deploy_manifests.generate(tmp_path, REPO / "model_store", archives=False)
    in_cluster = read_properties(tmp_path / "k8s" / "config.properties")
    kserve = read_properties(tmp_path / "kserve" / "config" / "config.properties")
    # The image: relative to its WORKDIR, where the Dockerfile copies the file (and the build context includes it).
    relative = log_config_path(in_cluster)
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    assert re.search(rf"^COPY (--chown=\S+ )?config/log4j2.xml {re.escape(str(relative))}$", dockerfile, re.M)
    assert "!config/log4j2.xml" in (REPO / ".dockerignore").read_text().splitlines()
    # KServe: an absolute path into the model layout, next to config.properties, with the same content.
    assert log_config_path(kserve) == Path("/mnt/models/config/log4j2.xml")
    assert (tmp_path / "kserve" / "config" / "log4j2.xml").read_bytes() == LOG4J.read_bytes()
    assert "-Xmx1g" in kserve["vmargs"]


def test_start_log_holds_one_start_and_keeps_the_previous(tmp_path, monkeypatch):
    """torchserve-start.log is the JVM's stdout: a restart must not append to it forever."""
    from scripts.ops import server as server_module

    starts = iter(["first start\n", "second start\n"])

    def fake_run(command, cwd, env, stdout, stderr):
        stdout.write(next(starts).encode())
        return type("Result", (), {"returncode": 0})()

    monkeypatch.setattr(server_module.subprocess, "run", fake_run)
    config = tmp_path / "config.properties"
    config.write_text(f"model_store={tmp_path}\n")
    server = server_module.Server(config, tmp_path / "run", tmp_path / "logs")
    server.start()
    server.start()
    assert (tmp_path / "logs" / "torchserve-start.log").read_text() == "second start\n"
    assert (tmp_path / "logs" / "torchserve-start.log.1").read_text() == "first start\n"
