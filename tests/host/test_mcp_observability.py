"""Observability of ``toolseam mcp --http`` as a process (issue 49): a client's
``params._meta.traceparent`` is the parent of the MCP SDK's ``tools/call {name}`` server span,
whose child is the call's ``execute_tool`` span — received by the test's OTLP receiver from the
server's own exporter, configured the standard way; and ``GET /metrics`` behind the server's
bearer token, with this server's sessions and its calls' duration histogram."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from prometheus_client.parser import text_string_to_metric_families

from toolseam import Toolkit

from ..support.cli import TOOLSEAM
from ..support.mcp import GENERATED, connect, free_port, start_http, stop
from ..support.otlp_receiver import otlp_receiver
from ..support.promql import query
from ..support.timing import patience


async def test_an_mcp_clients_traceparent_is_the_parent_of_the_call(tmp_path: Path) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with otlp_receiver() as receiver:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                   OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer%20{receiver.token}",
                   OTEL_BSP_SCHEDULE_DELAY="100", OTEL_SERVICE_NAME="toolseam-mcp")
        url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log", env=env)
        try:
            async with connect(url) as client:
                traced = await client.call_tool("bash", {"command": "true"},
                                                meta={"traceparent": f"00-{trace_id}-{parent}-01"})
                untraced = await client.call_tool("bash", {"command": "exit 4"})
            assert not traced.is_error and untraced.is_error
            receiver.wait_for(lambda r: len(r.named("execute_tool bash")) == 2
                              and len(r.named("tools/call bash")) == 2, timeout=60)
        finally:
            stop(process)
    calls = sorted(receiver.named("tools/call bash"), key=lambda s: s.start_ns)
    tools = sorted(receiver.named("execute_tool bash"), key=lambda s: s.start_ns)
    assert (calls[0].trace_id, calls[0].parent_id) == (trace_id, parent)  # the client's span
    assert (tools[0].trace_id, tools[0].parent_id) == (trace_id, calls[0].span_id)
    assert tools[0].resource["service.name"] == "toolseam-mcp"
    assert calls[1].parent_id == "" and calls[1].trace_id != trace_id  # no traceparent: a root
    assert (tools[1].trace_id, tools[1].parent_id) == (calls[1].trace_id, calls[1].span_id)
    assert tools[1].attributes["error.type"] == "exit_code"
    assert receiver.refused == 0


def _families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    declared = Counter(line.split()[2] for line in text.splitlines() if line.startswith("# TYPE"))
    assert [name for name, n in declared.items() if n > 1] == []  # one TYPE line per name
    return {family.name: [(sample.name, sample.labels, sample.value) for sample in family.samples]
            for family in text_string_to_metric_families(text)}


async def _scraped_once_calls_show(http: httpx.AsyncClient, metrics: str, token: dict[str, str]
                                   ) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """A scrape reads the sessions at most once a second: the calls show on a later one."""
    deadline = time.monotonic() + patience(30)
    while True:
        families = _families((await http.get(metrics, headers=token)).text)
        if sum(value for *_, value in families.get("toolseam_session_calls", [])) >= 2:
            return families
        assert time.monotonic() < deadline, f"no session's calls in {families}"
        await asyncio.sleep(0.2)


async def test_metrics_want_the_token_and_show_the_calls(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log", env=env)
    metrics = url.removesuffix("/mcp") + "/metrics"
    token = {"Authorization": f"Bearer {GENERATED[url]}"}
    try:
        async with httpx.AsyncClient(timeout=30) as http, \
                Toolkit("host", base_dir=str(tmp_path)) as elsewhere:
            await elsewhere.call("bash", {"command": "true"})  # a session of another process
            for refused in ({}, {"Authorization": "Bearer " + "0" * 64},
                            {"Authorization": GENERATED[url]}):
                answer = await http.get(metrics, headers=refused)
                assert answer.status_code == 401, answer.text
                assert answer.headers["www-authenticate"].startswith("Bearer")
                assert "toolseam" not in answer.text
            before = await http.get(metrics, headers=token)
            assert before.status_code == 200, before.text
            assert before.headers["content-type"].startswith("text/plain")
            assert "gen_ai_execute_tool_duration_seconds" not in _families(before.text)
            async with connect(url) as client:
                await client.call_tool("bash", {"command": "exit 3"})
                await client.call_tool("write", {"path": "w.txt", "content": "x"})
                after = await _scraped_once_calls_show(http, metrics, token)
            assert (await http.post(metrics, headers=token)).status_code == 405
    finally:
        stop(process)
    counts = {(labels["gen_ai_tool_name"], labels["toolseam_outcome"]): value
              for name, labels, value in after["gen_ai_execute_tool_duration_seconds"]
              if name.endswith("_count") and labels["toolseam_backend"] == "host"}
    assert counts.get(("bash", "error")) == 1 and counts.get(("write", "ok")) == 1
    sessions = {labels["session_id"] for _, labels, _ in after["toolseam_session_calls"]}
    assert len(sessions) == 1 and elsewhere.session_id not in sessions  # this server's own
    (opened,) = after["toolseam_sessions_open"]  # the sessions' own family, not the process's too
    assert (opened[1]["toolseam_backend"], opened[2]) == ("host", 1.0)


async def test_prometheus_scrapes_the_mcp_server_with_its_token(tmp_path: Path) -> None:
    """Debian's Prometheus scrapes ``/metrics`` with the token from a ``credentials_file``
    (and is refused without it), and the calls' histogram answers PromQL."""
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is not installed: run scripts/setup-prometheus.sh"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log", env=env)
    target = url.removesuffix("/mcp").removeprefix("http://")
    token = tmp_path.parent / f"{tmp_path.name}.token"
    token.write_text(GENERATED[url] + "\n")
    token.chmod(0o600)
    web = free_port()
    config = tmp_path.parent / f"{tmp_path.name}-prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": "toolseam-mcp", "static_configs": [{"targets": [target]}],
             "authorization": {"type": "Bearer", "credentials_file": str(token)}},
            {"job_name": "no-token", "static_configs": [{"targets": [target]}]}]}))
    scraper = subprocess.Popen(
        [prometheus, f"--config.file={config}",
         f"--storage.tsdb.path={tmp_path.parent / f'{tmp_path.name}-tsdb'}",
         f"--web.listen-address=127.0.0.1:{web}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with connect(url) as client:
            await client.call_tool("bash", {"command": "true"})
            count = 'gen_ai_execute_tool_duration_seconds_count{gen_ai_tool_name="bash"}'
            deadline = time.monotonic() + patience(90)
            while True:
                with contextlib.suppress(OSError):  # not listening yet
                    found = query(web, count)
                    if found and query(web, 'up{job="no-token"}'):
                        break
                assert time.monotonic() < deadline, "prometheus never scraped the MCP server"
                await asyncio.sleep(0.5)
        scraped, refused = query(web, 'up{job="toolseam-mcp"}'), query(web, 'up{job="no-token"}')
    finally:
        scraper.terminate()
        scraper.wait(30)
        stop(process)
    assert [float(r["value"][1]) for r in found] == [1.0]
    assert found[0]["metric"]["toolseam_outcome"] == "ok"
    assert [r["value"][1] for r in scraped] == ["1"]
    assert [r["value"][1] for r in refused] == ["0"]  # 401 without the token


async def test_a_unix_socket_without_a_token_serves_no_metrics(tmp_path: Path) -> None:
    """The socket's mode admits its owner to /mcp; /metrics wants a token all the same."""
    where = tmp_path / "mcp.sock"
    log = tmp_path.parent / f"{tmp_path.name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen([*TOOLSEAM, "mcp", "--http", f"unix:{where}", "--base-dir",
                                    str(tmp_path)], stdout=subprocess.DEVNULL, stderr=out)
    try:
        deadline = time.monotonic() + patience(90)
        while "listening" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.1)
        transport = httpx.AsyncHTTPTransport(uds=str(where))
        async with httpx.AsyncClient(transport=transport, timeout=30) as http:
            answer = await http.get("http://localhost/metrics")
            async with Client(streamable_http_client("http://localhost/mcp",
                                                     http_client=http)) as owner:
                called = await owner.call_tool("bash", {"command": "true"})
            again = await http.get("http://localhost/metrics")
    finally:
        stop(process)
    assert not called.is_error  # the owner reaches /mcp
    assert [answer.status_code, again.status_code] == [401, 401]
    assert "toolseam" not in again.text
