"""``toolseam metrics --listen`` scraped by Debian's Prometheus server (issue 49): a live
session's figures, queried back with PromQL over Prometheus's HTTP API; a scrape without the
bearer token is refused (the target is down). Prometheus comes from scripts/setup-prometheus.sh."""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.promql import query
from .test_ps import REPO, Held


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def metrics_endpoint(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    token = tmp_path / "metrics.token"
    token.write_text(secrets.token_hex(32) + "\n")
    token.chmod(0o600)
    server = subprocess.Popen(
        [sys.executable, "-m", "toolseam", "metrics", "--listen", "127.0.0.1:0",
         "--token-file", str(token)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    line = server.stdout.readline()
    port = int(line.split("127.0.0.1:")[1].split("/")[0])
    try:
        yield port, token
    finally:
        server.kill()
        server.wait()
        server.stdout.close()


def test_prometheus_scrapes_the_sessions_and_answers_promql(
        tmp_path: Path, metrics_endpoint: tuple[int, Path]) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is not installed: run scripts/setup-prometheus.sh"
    port, token = metrics_endpoint
    base = tmp_path / "work"
    base.mkdir()
    held = Held(base)
    web = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": "toolseam", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
             "authorization": {"type": "Bearer", "credentials_file": str(token)}},
            {"job_name": "no-token", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}))
    server = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pids = f'toolseam_session_pids{{session_id="{held.session_id}"}}'
        deadline = time.monotonic() + 90
        while True:
            try:
                found = query(web, pids)
                if found and query(web, 'up{job="no-token"}'):
                    break
            except OSError:
                pass  # not listening yet
            assert time.monotonic() < deadline, "prometheus never scraped the session"
            time.sleep(0.5)
        assert float(found[0]["value"][1]) >= 1
        assert found[0]["metric"]["toolseam_backend"] == "host"
        (cpu,) = query(web, f'toolseam_session_cpu_time_seconds_total{{session_id='
                            f'"{held.session_id}"}}')
        assert float(cpu["value"][1]) > 0
        opened = query(web, 'sum by (toolseam_backend) (toolseam_sessions_open)')
        assert any(r["metric"]["toolseam_backend"] == "host" and float(r["value"][1]) >= 1
                   for r in opened)
        (refused,) = query(web, 'up{job="no-token"}')
        assert refused["value"][1] == "0"  # a scrape without the token gets 401
        (scraped,) = query(web, 'up{job="toolseam"}')
        assert scraped["value"][1] == "1"
    finally:
        server.terminate()
        server.wait(30)
        held.stop()
