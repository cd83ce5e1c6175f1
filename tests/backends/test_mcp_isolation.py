"""Two real MCP clients (two bearer tokens: two principals) of one ``toolseam mcp --http``
never share a sandbox: not its jobs (list, wait, kill, eviction through ``max_jobs``), not its
read approvals, not a handle the other was given; and an approval counts only as a client's
answer to the question this server put to that client."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from ..support.mcp import client, connect, start_http, stop, text, tokens_file

Server = tuple[str, subprocess.Popen[bytes]]


def settings(tmp: Path, **values: Any) -> str:
    path = tmp.parent / f"{tmp.name}-settings.json"
    path.write_text(json.dumps(values))
    return str(path)


@pytest.fixture
def jobs_server(tmp_path: Path) -> Iterator[Server]:
    config = settings(tmp_path, timeout_policy="detach", default_timeout_ms=300, max_jobs=1)
    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log",
                              "--config", config, *tokens_file(tmp_path))
    try:
        yield url, process
    finally:
        stop(process)


async def test_sessionless_clients_never_see_each_others_jobs(jobs_server: Server) -> None:
    url, _ = jobs_server
    async with client(url, "alice") as alice, client(url, "mallory") as mallory:
        started = await alice.call_tool("bash", {"command": "sleep 60 # alice's job",
                                                  "sandbox": "new"})
        assert started.structured_content is not None
        assert started.structured_content["metadata"]["detached"] is True, text(started)
        job = started.structured_content["metadata"]["jobId"]

        # mallory, with her own sandbox: no trace of alice's job by any form
        first = await mallory.call_tool("bash", {"jobs": True, "sandbox": "new"})
        assert "alice" not in text(first), text(first)
        mine = started.structured_content["sandbox"]
        assert mine in started.content[-1].text  # type: ignore[union-attr]
        hers = first.structured_content["sandbox"]
        assert hers != mine
        for form in ({"wait": job, "timeout": 100}, {"kill": job}):
            result = await mallory.call_tool("bash", {**form, "sandbox": hers})
            assert result.is_error and f"no job {job}" in text(result), text(result)
        # her own job fills HER max_jobs; alice's is not evicted
        await mallory.call_tool("bash", {"command": "sleep 60 # mallory's job", "sandbox": hers})
        await mallory.call_tool("bash", {"command": "sleep 61 # again", "sandbox": hers})
        # a guessed or borrowed-looking handle opens nothing
        for guess in (mine[:-1] + ("A" if mine[-1] != "A" else "B"), "1", ""):
            result = await mallory.call_tool("bash", {"jobs": True, "sandbox": guess})
            assert guess == "" or (result.is_error and "no open sandbox" in text(result))

        listed = await alice.call_tool("bash", {"jobs": True, "sandbox": mine})
        assert "alice's job" in text(listed) and "mallory" not in text(listed), text(listed)
        killed = await alice.call_tool("bash", {"kill": job, "sandbox": mine})
        assert not killed.is_error, text(killed)


@pytest.fixture
def approvals_server(outside_tree: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    config = settings(tmp_path, read_scope="working-dir")
    url, process = start_http(outside_tree / "inside", tmp_path.parent / f"{tmp_path.name}.log",
                              "--config", config, "--approvals", confine=False)
    try:
        yield url, outside_tree / "outside.txt"
    finally:
        stop(process)


def made_up_approvals(path: Path) -> list[dict[str, Any]]:
    """What a client may send unasked: an answer alone, or with a state it wrote itself."""
    answer = {"read-approval": types.ElicitResult(action="accept", content={"answer": "session"})}
    return [{"input_responses": answer},
            {"input_responses": answer, "request_state": json.dumps({"path": str(path)})},
            {"input_responses": answer, "request_state": json.dumps(
                {"path": str(path), "nonce": "x" * 22})}]


async def refused(client: Client, arguments: dict[str, Any], **extra: Any) -> str:
    """Why the read was refused: the SDK's verdict on a forged state, or the tool's refusal."""
    try:
        result = await client.call_tool("read", arguments, **extra)
    except MCPError as exc:
        return str(exc)
    assert result.is_error and "was not approved" in text(result), text(result)
    return text(result)


async def test_an_approval_sent_unasked_counts_for_nothing(approvals_server: tuple[str, Path]
                                                           ) -> None:
    url, outside = approvals_server
    async with connect(url) as mallory:  # declares no elicitation: can never be asked
        for extra in made_up_approvals(outside):
            await refused(mallory, {"path": str(outside)}, **extra)
        first = await mallory.call_tool("read", {"path": ".", "sandbox": "new"})
        hers = first.structured_content["sandbox"]
        for extra in made_up_approvals(outside):  # in a sandbox she holds the handle of
            await refused(mallory, {"path": str(outside), "sandbox": hers}, **extra)


async def test_one_clients_approval_widens_no_other_clients_reads(
        approvals_server: tuple[str, Path]) -> None:
    url, outside = approvals_server
    asked: list[str] = []

    async def always(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"answer": "session"})

    async with connect(url, elicitation_callback=always) as alice, connect(url) as mallory:
        allowed = await alice.call_tool("read", {"path": str(outside)})
        assert not allowed.is_error and asked, text(allowed)
        # one principal (both hold the token the server generated), another sandbox of it
        await refused(mallory, {"path": str(outside), "sandbox": "new"})
        for extra in made_up_approvals(outside):
            await refused(mallory, {"path": str(outside), "sandbox": "new"}, **extra)
        still = await alice.call_tool("read", {"path": str(outside)})  # her default sandbox
        assert not still.is_error and len(asked) == 1  # "session", in alice's sandbox


async def test_an_answer_counts_once(approvals_server: tuple[str, Path]) -> None:
    """Replaying the sealed state and the answer of an earlier round gets nothing more."""
    url, outside = approvals_server

    async def never(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise AssertionError("driven by hand")

    async with connect(url, elicitation_callback=never) as alice:
        asked = await alice.session.call_tool("read", {"path": str(outside)},
                                              allow_input_required=True)
        assert isinstance(asked, types.InputRequiredResult)
        once = {"read-approval": types.ElicitResult(action="accept", content={"answer": "once"})}
        first = await alice.session.call_tool("read", {"path": str(outside)}, input_responses=once,
                                              request_state=asked.request_state,
                                              allow_input_required=True)
        assert isinstance(first, types.CallToolResult) and not first.is_error, first
        replay = await alice.session.call_tool("read", {"path": str(outside)},
                                               input_responses=once,
                                               request_state=asked.request_state,
                                               allow_input_required=True)
        assert not (isinstance(replay, types.CallToolResult) and not replay.is_error), replay


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_sessionless_clients_never_see_each_others_files_in_containers(
        tmp_path: Path) -> None:
    """docker, copy mode: each client's container has its own copy of the workspace and /tmp."""
    from ..support.engines import IMAGE, endpoint

    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log", "--backend",
                              "docker", "--endpoint", endpoint("docker"), "--image", IMAGE,
                              "--pull", "never", "--workspace-mode", "copy", "--workspace",
                              str(tmp_path), *tokens_file(tmp_path), confine=False)
    try:
        async with client(url, "alice") as alice, client(url, "mallory") as mallory:
            wrote = await alice.call_tool("bash", {"command": "echo mine > /tmp/alice.secret && "
                                                              "echo draft > alice-draft.txt"})
            assert not wrote.is_error, text(wrote)
            looked = await mallory.call_tool("bash", {"command": "cat /tmp/alice.secret; ls"})
            assert "mine" not in text(looked) and "alice-draft" not in text(looked), text(looked)
            again = await alice.call_tool("bash", {"command": "cat /tmp/alice.secret"})
            assert text(again) == "mine\n"
    finally:
        stop(process)
