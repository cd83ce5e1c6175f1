"""``toolseam mcp --branching`` driven by the official MCP client (issue 48, front ends): the
tools are there only with the flag; snapshot → changes → restore leaves exactly the snapshot's
tree; a bad id, a snapshot taken outside this server, another client's snapshot, a tampered
store entry and a manifest another user planted are refused by name with nothing changed; a
fork's children are handle sandboxes of their own, and a branch comes home by snapshot +
restore."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from mcp import Client

from toolseam import Toolkit
from toolseam.frontends.mcp.branching import Branching
from toolseam.frontends.mcp.sandboxes import Sandbox

from ..support.mcp import client, start_http, stdio_params, stop, text, tokens_file
from ..support.snapshot_stores import own_store, work_tree
from ..support.trees import describe

BRANCHING = {"snapshot", "restore", "fork"}
NOBODY = 65534


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The server (it inherits the environment) and this test share a store of their own."""
    return own_store(tmp_path / "store", monkeypatch)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return work_tree(tmp_path / "work")


def structured(result: types.CallToolResult) -> dict[str, Any]:
    content: dict[str, Any] | None = result.structured_content
    assert content is not None
    return content


async def test_without_the_flag_the_tools_are_not_listed_and_a_call_says_why(work: Path) -> None:
    async with Client(stdio_params(work)) as session:
        listed = {tool.name for tool in (await session.list_tools()).tools}
        assert not listed & BRANCHING
        for name in sorted(BRANCHING):
            refused = await session.call_tool(name, {})
            assert refused.is_error and "started without --branching" in text(refused), name
            assert structured(refused)["metadata"]["error"] == "UNKNOWN_TOOL"


async def test_snapshot_changes_restore_leave_exactly_the_snapshots_tree(
        work: Path, store: Path, tmp_path: Path) -> None:
    before = describe(work)
    config = tmp_path / "jobs.json"  # a bash call without a timeout becomes a job after 300 ms
    config.write_text(json.dumps({"timeout_policy": "detach", "default_timeout_ms": 300}))
    async with Client(stdio_params(work, "--branching", "--config", str(config))) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) >= BRANCHING
        assert tools["restore"].annotations and tools["restore"].annotations.destructive_hint
        taken = await session.call_tool("snapshot", {"label": "before"})
        assert not taken.is_error, text(taken)
        facts = structured(taken)["metadata"]["snapshot"]
        assert facts["label"] == "before" and facts["processes"] == "not carried"
        assert facts["id"] in text(taken) and "not carried" in text(taken)
        changed = await session.call_tool("bash", {"command": (
            "rm -r src/empty link && echo v2 > src/app.py && chmod 600 run.sh && mkdir new && "
            "echo x > new/f && ln -s /etc top"), "timeout": 60_000})
        assert not changed.is_error, text(changed)
        assert describe(work) != before
        restored = await session.call_tool("restore", {"snapshot": facts["id"]})
        assert not restored.is_error, text(restored)
        done = structured(restored)["metadata"]["restore"]
        assert done["snapshot"] == facts["id"] and done["processes"] == "not carried"
        assert done["removed"] >= 2 and done["written"] >= 2
        assert f"{done['written']} files written" in text(restored)
        assert describe(work) == before and "Ended" not in text(restored)

        started = await session.call_tool("bash", {"command": "touch late; sleep 300"})
        job = structured(started)["metadata"].get("jobId")
        assert job, text(started)
        restored = await session.call_tool("restore", {"snapshot": facts["id"]})
        assert structured(restored)["metadata"]["restore"]["ended_jobs"] == [job]
        assert f"Ended the running jobs {job} first" in text(restored)
        assert describe(work) == before

        bad = await session.call_tool("restore", {"snapshot": "0123456789abcdef0123"})
        assert bad.is_error and "no snapshot '0123456789abcdef0123' of yours" in text(bad)
        for wrong in ({}, {"snapshot": 7}, {"snapshot": facts["id"], "extra": 1}):
            assert (await session.call_tool("restore", wrong)).is_error, wrong
        huge = await session.call_tool("restore", {"snapshot": "a" * 5000})
        assert huge.is_error and len(text(huge)) < 400  # an attacker's id is not echoed whole

        # one of this user's own snapshots, taken outside the server: not the client's
        async with Toolkit("host", base_dir=str(work)) as outside:
            theirs = await outside.snapshot("the user's own")
        refused = await session.call_tool("restore", {"snapshot": theirs.id})
        assert refused.is_error and theirs.id in text(refused)
        assert structured(refused)["metadata"]["error"] == "UNKNOWN_SNAPSHOT"

        # a tampered object: refused by its digest before anything changed
        await session.call_tool("bash", {"command": "echo v3 > src/app.py; rm run.sh",
                                         "timeout": 60_000})
        now = describe(work)
        for stored in (store / "objects").rglob("*"):
            if stored.is_file():
                stored.chmod(0o600)
                stored.write_bytes(b"planted\n")
        tampered = await session.call_tool("restore", {"snapshot": facts["id"]})
        assert tampered.is_error and "does not match its digest" in text(tampered)
        assert structured(tampered)["metadata"]["failure"] == "could_not_run"
        assert describe(work) == now
        os.chown(store / "manifests" / f"{facts['id']}.json", NOBODY, NOBODY)  # another user's
        planted = await session.call_tool("restore", {"snapshot": facts["id"]})
        assert planted.is_error and "not this user's" in text(planted)
        assert describe(work) == now


async def test_fork_children_are_sandboxes_of_their_own_and_a_branch_comes_home(
        work: Path) -> None:
    before = describe(work)
    async with Client(stdio_params(work, "--branching")) as session:
        forked = await session.call_tool("fork", {"n": 2})
        assert not forked.is_error, text(forked)
        children = structured(forked)["metadata"]["children"]
        handles = [child["sandbox"] for child in children]
        assert len(handles) == 2 and all(len(handle) >= 43 for handle in handles)
        assert all(handle in text(forked) for handle in handles)
        for number, handle in enumerate(handles):
            wrote = await session.call_tool("write", {"path": "src/app.py", "content":
                                                      f"print('branch {number}')\n",
                                                      "sandbox": handle})
            assert not wrote.is_error, text(wrote)
            assert structured(wrote)["sandbox"] == handle
        for number, handle in enumerate(handles):
            read = await session.call_tool("bash", {"command": "cat src/app.py",
                                                    "sandbox": handle})
            assert text(read) == f"print('branch {number}')\n"
        assert describe(work) == before  # the parent's files are its own

        won = await session.call_tool("snapshot", {"sandbox": handles[1]})
        winner = structured(won)["metadata"]["snapshot"]["id"]
        home = await session.call_tool("restore", {"snapshot": winner})
        assert not home.is_error, text(home)
        assert (work / "src" / "app.py").read_text() == "print('branch 1')\n"

        for n in (0, 17, True, "2"):
            wrong = await session.call_tool("fork", {"n": n})
            assert wrong.is_error and "an integer from 1 to 16" in text(wrong), n
        guessed = await session.call_tool("read", {"path": "src/app.py", "sandbox": "x" * 43})
        assert guessed.is_error and "no open sandbox has this handle" in text(guessed)


@pytest.fixture
def two_clients(work: Path, tmp_path: Path) -> Iterator[str]:
    url, process = start_http(work, tmp_path / "server.log", "--branching",
                              *tokens_file(tmp_path))
    try:
        yield url
    finally:
        stop(process)


async def test_another_clients_snapshot_and_fork_are_refused(two_clients: str,
                                                             work: Path) -> None:
    async with client(two_clients, "alice") as alice:
        listed = {tool.name: tool for tool in (await alice.list_tools()).tools}
        assert "fork result" in listed["read"].input_schema["properties"]["sandbox"]["description"]
        taken = await alice.call_tool("snapshot", {"label": "alice's"})
        snap = structured(taken)["metadata"]["snapshot"]["id"]
        forked = await alice.call_tool("fork", {"n": 1})
        child = structured(forked)["metadata"]["children"][0]["sandbox"]
        assert text(await alice.call_tool("bash", {"command": "echo in the child",
                                                   "sandbox": child})) == "in the child\n"
    (work / "src" / "app.py").write_text("mallory was here\n")
    async with client(two_clients, "mallory") as mallory:
        refused = await mallory.call_tool("restore", {"snapshot": snap})
        theirs = await mallory.call_tool("bash", {"command": "true", "sandbox": child})
    assert refused.is_error and f"no snapshot '{snap}' of yours" in text(refused)
    assert theirs.is_error and "no open sandbox has this handle" in text(theirs)
    assert (work / "src" / "app.py").read_text() == "mallory was here\n"
    async with client(two_clients, "alice") as alice:
        restored = await alice.call_tool("restore", {"snapshot": snap})
    assert not restored.is_error, text(restored)
    assert (work / "src" / "app.py").read_text() == "print('v1')\n"


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=30), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


def _valid(name: str, arguments: dict[str, Any]) -> bool:
    if name == "snapshot":
        return set(arguments) <= {"label"} and isinstance(arguments.get("label"), str | None)
    if name == "fork":
        n = arguments.get("n")
        return set(arguments) == {"n"} and type(n) is int and 1 <= n <= 16
    return False  # restore: no id here was ever taken


def test_any_arguments_get_an_answer_never_a_crash(work: Path) -> None:
    """Whatever JSON a client sends the three tools, the answer is a result: an error naming
    what was wrong for anything but a valid call, and the files unchanged."""
    loop = asyncio.new_event_loop()
    toolkit = Toolkit("host", base_dir=str(work))
    loop.run_until_complete(toolkit.open())
    before = describe(work)

    async def admit(child: Toolkit, principal: str) -> Sandbox:
        raise AssertionError("no valid fork is generated")

    branching = Branching(admit)

    @settings(max_examples=80, deadline=None)
    @example("snapshot", {"label": None}).via("an optional label sent as null")
    @example("fork", {"n": 1.0}).via("a whole float is not an integer")
    @given(st.sampled_from(sorted(BRANCHING)),
           st.dictionaries(st.sampled_from(["label", "snapshot", "n", "x"]), JSON, max_size=3))
    def check(name: str, arguments: dict[str, Any]) -> None:
        assume(not _valid(name, arguments) or name == "snapshot")
        result = loop.run_until_complete(branching.call(name, dict(arguments), Sandbox(toolkit),
                                                        "local"))
        assert result.is_error is not _valid(name, arguments), (name, arguments, result.output)
        if result.is_error:
            assert result.output.startswith(f"{name}: ") and result.metadata["error"] in (
                "INVALID_ARGUMENTS", "UNKNOWN_SNAPSHOT")

    try:
        check()
        assert describe(work) == before
    finally:
        loop.run_until_complete(toolkit.close())
        loop.close()
