"""``toolseam snapshot`` and ``toolseam restore`` as real processes (issue 48, front ends;
decision 432): on a directory, and on a durable session by its handle — attached, acted on and
detached again; bad input is one line naming what was wrong, exit 2, nothing changed. And the
``snapshot``/``restore`` ops of ``serve --stdio`` (decision 433)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from toolseam.frontends.cli import main

from ..support.cli import TOOLSEAM, Server
from ..support.snapshot_stores import own_store, work_tree
from ..support.trees import describe

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return own_store(tmp_path / "store", monkeypatch)  # the subprocesses inherit it


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return work_tree(tmp_path / "work")


def toolseam(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TOOLSEAM, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


def answer(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def spoil(work: Path) -> None:
    (work / "src" / "app.py").write_text("print('v2')\n")
    (work / "src" / "empty").rmdir()
    (work / "run.sh").chmod(0o600)
    (work / "link").unlink()
    (work / "added").write_text("new\n")


def test_a_directory_snapshotted_changed_and_restored_is_exactly_the_snapshots(
        work: Path) -> None:
    before = describe(work)
    snap = answer(toolseam("snapshot", "--base-dir", str(work), "--label", "clean"))
    assert snap["label"] == "clean" and snap["backend"] == "host"
    assert snap["files"] == len(before) and snap["processes"] == "not carried"
    spoil(work)
    done = answer(toolseam("restore", snap["id"], "--base-dir", str(work)))
    assert done["snapshot"] == snap["id"] and done["ended_jobs"] == []
    assert describe(work) == before
    listed = toolseam("snapshots", "list")
    assert snap["id"] in listed.stdout and "clean" in listed.stdout


def test_bad_input_is_one_line_naming_it_and_changes_nothing(
        work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = answer(toolseam("snapshot", "--base-dir", str(work)))
    spoil(work)
    now = describe(work)
    handle = tmp_path / "handle.json"
    handle.write_text("{}")
    # one real process: the exit code and stderr a shell sees
    done = toolseam("restore", "0123456789abcdef0123", "--base-dir", str(work))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"toolseam: no snapshot 0123456789abcdef0123 in {tmp_path / 'store'}"], done.stderr
    for args, said in [  # the same main(), in this process: each a process start saved
        (("restore", snap["id"]), "restore replaces a whole tree: name it with --base-dir"),
        (("restore", "not-an-id", "--base-dir", str(work)), "'not-an-id' is not one"),
        (("restore", snap["id"], "--base-dir", str(tmp_path / "missing")), "does not exist"),
        (("restore", snap["id"], "--attach", str(handle), "--base-dir", str(work)),
         "restore --attach acts on the session as it is: drop --base-dir"),
        (("snapshot", "--attach", str(handle), "--backend", "docker", "--confine"),
         "drop --backend, --confine"),
        (("snapshot", "--attach", str(tmp_path / "nope")), "cannot read"),
        (("restore",), "the following arguments are required: ID"),
    ]:
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse's usage error
            code = int(exit_.code or 0)
        out, err = capsys.readouterr()
        assert code == 2, (args, out, err)
        assert said in err and len(err.strip().splitlines()) == 1, err
        assert "Traceback" not in err and out == ""
    assert describe(work) == now
    assert not (tmp_path / "missing").exists()

    manifest = tmp_path / "store" / "manifests" / f"{snap['id']}.json"
    os.chown(manifest, NOBODY, NOBODY)  # a snapshot planted by another user: never read
    assert main(["restore", snap["id"], "--base-dir", str(work)]) == 3
    out, err = capsys.readouterr()
    assert "could not run" in err and "not this user's" in err and snap["id"] in err, err
    assert describe(work) == now


def _serve(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*TOOLSEAM, "serve", "--stdio", "--detach-on-eof", *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)


def _detach(server: subprocess.Popen[str]) -> None:
    assert server.stdin is not None
    server.stdin.close()  # EOF: detached, the sandbox and its jobs go on
    assert server.wait(timeout=60) == 0


def test_a_durable_session_by_its_handle_goes_on_after(work: Path, tmp_path: Path) -> None:
    config = tmp_path / "settings.json"  # a command still running after 300 ms is a job
    config.write_text(json.dumps({"timeout_policy": "detach", "default_timeout_ms": 300}))
    first = _serve("--orphan-timeout", "60", "--config", str(config), "--base-dir", str(work))
    assert first.stdout is not None
    handle_line = json.loads(first.stdout.readline())
    handle = tmp_path / "handle.json"
    handle.write_text(json.dumps(handle_line))
    servers = [first]
    try:
        busy = toolseam("snapshot", "--attach", str(handle))  # one client at a time
        assert busy.returncode == 2 and "another client is attached" in busy.stderr
        _detach(first)
        before = describe(work)
        snap = answer(toolseam("snapshot", "--attach", str(handle)))
        assert snap["session"] == handle_line["handle"]["session_id"]
        second = _serve("--attach", str(handle))
        servers.append(second)
        assert second.stdin is not None and second.stdout is not None
        second.stdin.write(json.dumps({"id": 1, "tool": "bash", "args": {
            "command": "echo v2 > src/app.py; rm -r src/empty link; sleep 120"}}) + "\n")
        second.stdin.flush()
        lines = [json.loads(second.stdout.readline()) for _ in range(2)]
        job = next(line for line in lines if line.get("id") == 1)["result"]["metadata"]["jobId"]
        _detach(second)
        assert describe(work) != before
        done = answer(toolseam("restore", snap["id"], "--attach", str(handle)))
        assert done["ended_jobs"] == [job]
        assert describe(work) == before
        again = answer(toolseam("snapshot", "--attach", str(handle), "--label", "still there"))
        assert again["session"] == snap["session"]  # detached again, not closed
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
                server.wait()
            for stream in (server.stdin, server.stdout):
                if stream is not None:
                    stream.close()
        subprocess.run([*TOOLSEAM, "serve", "--stdio", "--attach", str(handle)], input="",
                       capture_output=True, text=True, cwd=REPO, timeout=60)  # EOF: close it
    assert not os.path.exists(handle_line["handle"]["socket"])


def test_serve_stdio_snapshot_and_restore_ops(work: Path, store: Path) -> None:
    before = describe(work)
    with Server("--base-dir", str(work)) as server:
        server.send({"op": "snapshot", "label": "clean"})
        snap = server.read()["snapshot"]
        assert snap["label"] == "clean" and snap["processes"] == "not carried"
        server.send({"id": 1, "tool": "bash", "args": {"command": "rm -r src link; echo x > y"}})
        assert server.read()["id"] == 1
        server.send({"op": "restore", "snapshot": snap["id"]})
        restored = server.read()
        assert restored["op"] == "restored" and restored["result"]["snapshot"] == snap["id"]
        assert describe(work) == before
        for line, code, said in [
            ({"op": "restore", "snapshot": "0123456789abcdef0123"}, "INVALID_CONFIGURATION",
             "no snapshot 0123456789abcdef0123"),
            ({"op": "restore"}, "BAD_REQUEST", "unknown or malformed op line"),
            ({"op": "snapshot", "label": 5}, "BAD_REQUEST", "unknown or malformed op line"),
        ]:
            server.send(line)
            error = server.read()["error"]
            assert error["code"] == code and said in error["message"], error
        (work / "src" / "app.py").write_text("changed since\n")  # its object must be read
        for stored in (store / "objects").rglob("*"):
            if stored.is_file():
                stored.chmod(0o600)
                stored.write_bytes(b"planted\n")
        server.send({"op": "restore", "snapshot": snap["id"]})
        tampered = server.read()
        assert tampered["op"] == "restore" and tampered["error"]["code"] == "COULD_NOT_RUN"
        assert "does not match its digest" in tampered["error"]["message"]
        assert (work / "src" / "app.py").read_text() == "changed since\n"
        server.send({"op": "close"})
        assert server.read() == {"op": "closed"}
