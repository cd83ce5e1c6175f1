"""The backend contract suite, shipped so every backend — ours or yours — binds to ONE suite.

Bind a backend with a few lines: subclass the parts it supports and provide ``make_backend``::

    class TestMyBackend(FileContract, ListingContract, ExecContract):
        async def make_backend(self, host_dir):
            return MyBackend(workspace=str(host_dir)), str(host_dir)

``make_backend`` gets an empty host directory and returns the backend plus the base dir as the
sandbox sees it (the same dir for the host backend, ``/workspace`` for a bind mount). Parts:

* ``FileContract``, ``ListingContract`` — the file part, set up through the backend itself.
* ``ExecContract`` — exit codes, order, jobs, deadlines, kill, streaming.
* ``ProcessTreeContract`` — real processes: escapees are killed, nothing survives
  (needs ``survivors(marker)``: command lines of live processes containing ``marker``).
* ``HostDirContract`` — symlinks, FIFOs and modes made on the host dir (bind-mounted or local).
* ``JobContract`` — the detach timeout policy and the bash job forms, through a Toolkit.
* ``HostileContract`` — what a hostile model or command does (``kill -9 -1``, processes that
  shed their job's marks, catastrophic regexes, 1 GiB lines, out-of-range input, read-only
  files): the session lives on, memory and time stay bounded (needs ``survivors`` and the
  host dir).
* ``ReadToolContract`` (``toolseam.testing.read_tool``) — the read tool as opencode has it:
  images known by their bytes, BMP and TIFF as images, the 50 KB page cap and its hint.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

# The public package only: what a user's own backend is tested against is what users import.
from toolseam import FileOpError, Settings, Toolkit
from toolseam.seam import (
    BuiltinExec,
    ChangeSet,
    DeleteOp,
    JobStatus,
    OutputChunk,
    PageRequest,
    PathRef,
    SpawnRequest,
    WriteOp,
)
from toolseam.session.raw import FileLimitError, RawSandbox, UnknownUserError, UserUnsupportedError

from .hostile import ORDERS, HostileBackend
from .read_grids import (
    PAGE_CONTENTS,
    PAGES,
    WINDOW_CONTENTS,
    WINDOWS,
    read_page_mismatch,
    read_window_mismatch,
)


@dataclass
class Sandbox:
    backend: BuiltinExec
    base: str  # the workspace as the sandbox sees it
    host_dir: Path  # the same directory on the host (unused by in-memory backends)

    def ref(self, path: str = ".", confine: bool = True) -> PathRef:
        return PathRef(base=self.base, path=path, confine=confine)

    async def put(self, files: dict[str, bytes]) -> None:
        for path, data in files.items():
            await self.backend.write(self.ref(path), data)

    def spawn(self, command: str, **fields: object) -> SpawnRequest:
        job = fields.pop("job", None) or f"c-{uuid.uuid4().hex[:8]}"
        env = fields.pop("env", None) or {"PATH": "/usr/local/bin:/usr/bin:/bin"}
        return SpawnRequest(job=str(job), argv=["/bin/sh", "-c", command], cwd=self.base,
                            env=env, **fields)


class _Bound:
    async def survivors(self, sandbox: Sandbox, marker: str) -> list[str]:
        """Command lines of live processes containing ``marker`` (process-tree parts)."""
        raise NotImplementedError
    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        raise NotImplementedError

    def host_root(self, tmp_path: Path) -> Path:
        """Where the workspace is made; a rootless engine needs a path its user can reach."""
        return tmp_path

    async def _run(self, sandbox: Sandbox, command: str, **fields: object) -> JobStatus:
        """One command to its end, then released."""
        request = sandbox.spawn(command, **fields)
        try:
            return await sandbox.backend.start(request)
        finally:
            await sandbox.backend.release(request.job)

    @contextlib.asynccontextmanager
    async def opened(self, tmp_path: Path) -> AsyncIterator[Sandbox]:
        """An open sandbox of the binding's backend in a fresh workspace, closed after."""
        host_dir = self.host_root(tmp_path) / "ws"
        host_dir.mkdir(parents=True)
        os.chmod(host_dir, 0o777)  # a rootless sandbox maps to another uid
        backend, base = await self.make_backend(host_dir)
        await backend.open()
        try:
            yield Sandbox(backend, base, host_dir)
        finally:
            await backend.close()

    @pytest_asyncio.fixture
    async def sandbox(self, tmp_path: Path) -> AsyncIterator[Sandbox]:
        async with self.opened(tmp_path) as opened:
            yield opened


class FileContract(_Bound):
    async def test_write_creates_parents_and_reads_back(self, sandbox: Sandbox) -> None:
        first = await sandbox.backend.write(sandbox.ref("a/b/c.txt"), "héllo\n".encode())
        again = await sandbox.backend.write(sandbox.ref("a/b/c.txt"), b"second\n")
        assert (first.bytes, first.created, again.created) == (7, True, False)
        assert (await sandbox.backend.read_text(sandbox.ref("a/b/c.txt"))).text == "second\n"

    async def test_big_content_round_trips(self, sandbox: Sandbox) -> None:
        """Megabytes each way: a request and an answer span many socket reads, and the host
        waits for a slow reader instead of buffering without bound."""
        data = bytes(range(256)) * (12 << 10)  # 3 MiB, every byte value
        text = "".join(f"line {i} ünïcode\n" for i in range(150_000))
        await sandbox.backend.write(sandbox.ref("big.bin"), data)
        await sandbox.backend.write(sandbox.ref("big.txt"), text.encode())
        assert (await sandbox.backend.read_bytes(sandbox.ref("big.bin"))).data == data
        assert (await sandbox.backend.read_text(sandbox.ref("big.txt"))).text == text

    async def test_read_window_is_a_slice_of_split_lines(self, sandbox: Sandbox) -> None:
        """Every window of every content (``read_grids``), all in this one sandbox."""
        await sandbox.put({f"w{i}.txt": c.encode() for i, c in enumerate(WINDOW_CONTENTS)})
        wrong = []
        for i, content in enumerate(WINDOW_CONTENTS):
            for window in WINDOWS:
                found = await read_window_mismatch(sandbox.backend, sandbox.ref(f"w{i}.txt"),
                                                   content, window)
                wrong += [found] if found else []
        assert wrong == []

    @pytest.mark.parametrize(("setup", "path", "code"), [
        ({}, "missing.txt", "not_found"),
        ({"d/x": b""}, "d", "is_directory"),
        ({"bin.dat": b"\xff\xfe\x00"}, "bin.dat", "not_utf8"),
        ({"big.txt": b"x" * 100}, "big.txt", "too_large"),
    ])
    async def test_read_failures_have_codes(self, sandbox: Sandbox, setup: dict[str, bytes],
                                            path: str, code: str) -> None:
        await sandbox.put(setup)
        with pytest.raises(FileOpError) as caught:
            await sandbox.backend.read_text(sandbox.ref(path), refuse_above_bytes=50)
        assert caught.value.code == code

    async def test_read_page_is_a_slice_of_lines(self, sandbox: Sandbox) -> None:
        """Every page of every content (``read_grids``), all in this one sandbox."""
        await sandbox.put({f"p{i}.txt": c.encode() for i, c in enumerate(PAGE_CONTENTS)})
        wrong = []
        for i, content in enumerate(PAGE_CONTENTS):
            for offset, limit in PAGES:
                found = await read_page_mismatch(sandbox.backend, sandbox.ref(f"p{i}.txt"),
                                                 content, offset, limit)
                wrong += [found] if found else []
        assert wrong == []

    async def test_read_page_bounds_lines_and_bytes(self, sandbox: Sandbox) -> None:
        """A long line is cut and the rest skipped; a page stops at its byte budget."""
        await sandbox.put({"long.txt": b"a\n" + "é".encode() * 600_000 + b"\nz\n",
                           "wide.txt": b"0123456789\n" * 100})
        page = await sandbox.backend.read_page(sandbox.ref("long.txt"),
                                               PageRequest(max_line_chars=5))
        assert (page.lines, page.cut, page.total) == (["a", "ééééé", "z"], [2], 3)
        narrow = await sandbox.backend.read_page(sandbox.ref("wide.txt"),
                                                 PageRequest(max_bytes=50))
        assert (len(narrow.lines), narrow.next) == (4, 5)

    async def test_read_page_refuses_binary(self, sandbox: Sandbox) -> None:
        await sandbox.put({"nul.txt": b"abc\x00def\n"})
        with pytest.raises(FileOpError) as caught:
            await sandbox.backend.read_page(sandbox.ref("nul.txt"), PageRequest())
        assert caught.value.code == "binary"

    async def test_list_dir_names_entries(self, sandbox: Sandbox) -> None:
        await sandbox.put({"d/b.txt": b"", "d/a/x.txt": b"", "d/c.txt": b""})
        listing = await sandbox.backend.list_dir(sandbox.ref("d"), 2)
        assert listing.total == 3 and len(listing.entries) == 2
        assert set(listing.entries) <= {"a/", "b.txt", "c.txt"}
        full = await sandbox.backend.list_dir(sandbox.ref("d"), 10)
        assert sorted(full.entries) == ["a/", "b.txt", "c.txt"]
        with pytest.raises(FileOpError) as caught:
            await sandbox.backend.list_dir(sandbox.ref("d/b.txt"), 10)
        assert caught.value.code == "not_directory"

    async def test_write_keeps_a_bom_when_asked(self, sandbox: Sandbox) -> None:
        await sandbox.put({"bom.txt": b"\xef\xbb\xbfold"})
        await sandbox.backend.write(sandbox.ref("bom.txt"), b"new", keep_bom=True)
        assert (await sandbox.backend.read_bytes(sandbox.ref("bom.txt"))).data == b"\xef\xbb\xbfnew"
        await sandbox.backend.write(sandbox.ref("bom.txt"), b"plain")
        assert (await sandbox.backend.read_bytes(sandbox.ref("bom.txt"))).data == b"plain"

    @pytest.mark.parametrize("path", ["../outside.txt", "a/../../outside.txt", "/etc/passwd",
                                      "/outside.txt"])
    async def test_confinement_refuses_escapes(self, sandbox: Sandbox, path: str) -> None:
        for attempt in (sandbox.backend.read_text(sandbox.ref(path)),
                        sandbox.backend.write(sandbox.ref(path), b"x")):
            with pytest.raises(FileOpError) as caught:
                await attempt
            assert caught.value.code == "outside_base"
            assert caught.value.path == path

    async def test_commit_is_all_or_nothing(self, sandbox: Sandbox) -> None:
        await sandbox.put({"a.txt": b"A", "b.txt": b"B"})
        sha_a = hashlib.sha256(b"A").hexdigest()
        change = ChangeSet(base=sandbox.base, confine=True, ops=[
            WriteOp(path="a.txt", data=b"A2", expect=sha_a),
            WriteOp(path="new/c.txt", data=b"C", expect="absent"),
            DeleteOp(path="b.txt", expect="0" * 64),  # stale: nothing may change
        ])
        with pytest.raises(FileOpError) as caught:
            await sandbox.backend.commit(change)
        assert caught.value.code == "stale"
        assert (await sandbox.backend.read_text(sandbox.ref("a.txt"))).text == "A"
        assert (await sandbox.backend.stat(sandbox.ref("new"))).kind == "missing"
        good = change.model_copy(update={"ops": [*change.ops[:2], DeleteOp(path="b.txt")]})
        result = await sandbox.backend.commit(good)
        assert (result.written, result.deleted, result.created) == (2, 1, 1)
        assert (await sandbox.backend.stat(sandbox.ref("b.txt"))).kind == "missing"
        assert (await sandbox.backend.read_text(sandbox.ref("new/c.txt"))).text == "C"

    async def test_stat_kinds(self, sandbox: Sandbox) -> None:
        await sandbox.put({"d/f.txt": b"12345"})
        kinds = [(await sandbox.backend.stat(sandbox.ref(p))).kind for p in ("d", "d/f.txt", "nope")]
        assert kinds == ["dir", "file", "missing"]
        assert (await sandbox.backend.stat(sandbox.ref("d/f.txt"))).size == 5


# Names that separate the wrong orders (CONTRACT §4): flat code-point order puts "alpha-b.txt"
# before "alpha/f.txt"; "ms.txt" < "mß.txt"; U+E000 < U+1F600 in code points, not in UTF-16.
ORDER_FIXTURE = {
    "alpha/f.txt": b"hit\n", "alpha-b.txt": b"hit\n", "ms.txt": b"hit\n", "m\u00df.txt": b"hit\n",
    "\ue000.txt": b"hit\n", "\U0001f600.txt": b"hit\n", ".hidden/h.txt": b"hit\n",
    "z/y/x.txt": b"hit\nmiss\nhit\n",
}
ORDER_FIXTURE_SORTED = [".hidden/h.txt", "alpha-b.txt", "alpha/f.txt", "ms.txt", "m\u00df.txt",
                        "z/y/x.txt", "\ue000.txt", "\U0001f600.txt"]


class ListingContract(_Bound):
    async def test_walk_rule(self, sandbox: Sandbox) -> None:
        await sandbox.put({".hidden": b"", "a/b/c.txt": b"", ".git/config": b"",
                           "node_modules/m.js": b"", "sub/node_modules/n.js": b"",
                           "sub/.git/HEAD": b"", "sub/.gitignore": b"", "node_modules.txt": b""})
        listing = await sandbox.backend.list_files(sandbox.ref())
        assert sorted(listing.paths) == [".hidden", "a/b/c.txt", "node_modules.txt", "sub/.gitignore"]

    async def test_grep_reports_every_hit_and_counts_binary(self, sandbox: Sandbox) -> None:
        await sandbox.put({"a.txt": b"one\ntwo\r\nthree two\n", "b.bin": b"two\xff\n",
                           "c/d.txt": b"nothing\n"})
        listing = await sandbox.backend.grep(sandbox.ref(), "two")
        assert sorted(h[:3] for h in listing.hits) == [("a.txt", 2, "two"), ("a.txt", 3, "three two")]
        assert listing.binary_files == 1

    async def test_grep_file_root_is_that_file(self, sandbox: Sandbox) -> None:
        await sandbox.put({"dir/one.txt": b"x\n", "dir/two.txt": b"x\n"})
        listing = await sandbox.backend.grep(sandbox.ref("dir/one.txt"), "x")
        assert [h[:3] for h in listing.hits] == [("one.txt", 1, "x")]

    async def test_missing_root_is_an_error(self, sandbox: Sandbox) -> None:
        for call in (sandbox.backend.list_files(sandbox.ref("nope")),
                     sandbox.backend.grep(sandbox.ref("nope"), "x")):
            with pytest.raises(FileOpError) as caught:
                await call
            assert caught.value.code == "not_found"

    async def test_hostile_orders_change_no_byte(self, sandbox: Sandbox) -> None:
        await sandbox.put(ORDER_FIXTURE)
        calls = [("glob", {"pattern": "**/*", "limit": 5}), ("glob", {"pattern": "*.txt"}),
                 ("grep", {"pattern": "hit", "limit": 4}), ("grep", {"pattern": "hit"})]
        outputs = {}
        for label, backend in [("plain", sandbox.backend)] + [
                (order, HostileBackend(sandbox.backend, order, seed=7)) for order in ORDERS]:
            toolkit = Toolkit(backend, base_dir=sandbox.base)
            await toolkit.open()
            outputs[label] = [(await toolkit.call(n, a)).to_json() for n, a in calls]
        assert outputs["plain"][0]["output"] == "\n".join(ORDER_FIXTURE_SORTED[:5])
        assert outputs["plain"][0]["metadata"]["truncated"] is True
        assert outputs["plain"][2]["output"].splitlines()[0] == ".hidden/h.txt:1:hit"
        for label, result in outputs.items():
            assert result == outputs["plain"], label


class ExecContract(_Bound):

    async def test_exit_codes_are_results(self, sandbox: Sandbox) -> None:
        for code in (0, 3, 125, 126, 127):
            status = await self._run(sandbox, f"exit {code}")
            assert (status.outcome, status.state, status.exit_code) == ("ran", "exited", code)

    async def test_each_command_gets_exactly_its_environment(self, sandbox: Sandbox) -> None:
        """Also when it changes between calls (a backend may cache what it sent before)."""
        path = "/usr/local/bin:/usr/bin:/bin"
        first, second = {"PATH": path, "ONE": "1"}, {"PATH": path, "TWO": "2 two"}
        seen = []
        for env in (first, first, second, first, {**first, "ONE": "changed"}):
            status = await self._run(sandbox, "env", env=env)
            seen.append({k: v for k, v in (line.split("=", 1) for line in status.output.splitlines())
                         if k not in ("PWD", "SHLVL", "_") and not k.startswith("TOOLSEAM_")})
        assert seen == [first, first, second, first, {**first, "ONE": "changed"}]

    async def test_output_keeps_arrival_order_across_streams(self, sandbox: Sandbox) -> None:
        status = await self._run(sandbox, "printf a; sleep 0.05; printf b >&2; sleep 0.05; printf c")
        assert [(c.stream, c.text) for c in status.chunks] == [
            ("stdout", "a"), ("stderr", "b"), ("stdout", "c")]
        assert (status.stdout_bytes, status.stderr_bytes) == (2, 1)

    async def test_streaming_delivers_chunks_in_order(self, sandbox: Sandbox) -> None:
        seen: list[OutputChunk] = []
        request = sandbox.spawn("echo one; sleep 0.05; echo two >&2; sleep 0.05; echo three",
                                stream=True)
        status = await sandbox.backend.start(request, seen.append)
        await sandbox.backend.release(request.job)
        assert "".join(c.text for c in seen) == status.output == "one\ntwo\nthree\n"
        assert [c.stream for c in seen] == ["stdout", "stderr", "stdout"]

    async def test_job_outlives_the_call_then_wait_returns_exit(self, sandbox: Sandbox) -> None:
        request = sandbox.spawn("echo started; sleep 0.4; echo finished; exit 4", wait_ms=100)
        first = await sandbox.backend.start(request)
        assert (first.state, first.output) == ("running", "started\n")
        final = await sandbox.backend.wait(request.job, None)
        assert (final.state, final.exit_code, final.output) == ("exited", 4, "started\nfinished\n")
        await sandbox.backend.release(request.job)

    async def test_kill_ends_the_job(self, sandbox: Sandbox) -> None:
        request = sandbox.spawn("sleep 30", wait_ms=0)
        await sandbox.backend.start(request)
        started = time.monotonic()
        status = await sandbox.backend.kill(request.job)
        assert (status.state, status.killed, status.killed_tree) == ("exited", True, True)
        assert time.monotonic() - started < 2.5
        await sandbox.backend.release(request.job)

    async def test_deadline_is_enforced_by_the_sandbox(self, sandbox: Sandbox) -> None:
        started = time.monotonic()
        status = await self._run(sandbox, "echo before; sleep 30", deadline_ms=300)
        assert (status.timed_out, status.output) == (True, "before\n")
        assert time.monotonic() - started < 3.5


class ProcessTreeContract(_Bound):
    """Needs real processes; ``survivors`` looks for them after the call returned."""

    async def test_commands_start_with_default_signals(self, sandbox: Sandbox) -> None:
        """Nothing of the sandbox's own signal setup leaks in: a Python supervisor ignores
        SIGPIPE, and a command that inherited that would print "Broken pipe" in pipelines."""
        status = await self._run(sandbox, "yes | head -n 1; grep -E '^Sig(Ign|Blk)' /proc/self/status")
        lines = status.output.splitlines()
        assert lines[0] == "y" and "Broken pipe" not in status.output, status.output
        masks = dict(line.split(":\t") for line in lines[1:])
        pipe_bit = 1 << (signal.SIGPIPE - 1)
        assert int(masks["SigIgn"], 16) & pipe_bit == 0 and int(masks["SigBlk"], 16) == 0, masks

    async def test_timeout_kills_every_escapee(self, sandbox: Sandbox) -> None:
        marker = f"{uuid.uuid4().int % 1000 + 1000}"
        command = (
            f"setsid sleep {marker}.1 & "                      # a new session
            f"(sleep {marker}.2 &) ; "                          # double fork, re-parented
            f"set -m; sleep {marker}.3 & set +m; "              # its own process group
            f"(trap '' TERM; exec sleep {marker}.4) & "         # ignores SIGTERM
            f"sleep {marker}.5 & "                              # holds the output pipe
            f"echo ready; sleep {marker}.6"
        )
        started = time.monotonic()
        request = sandbox.spawn(command, deadline_ms=700, grace_ms=2000)
        status = await sandbox.backend.start(request)
        await sandbox.backend.release(request.job)
        elapsed = time.monotonic() - started
        assert status.timed_out and status.killed_tree is True
        # (dash says "set: can't access tty" on stderr; only stdout is ours to compare)
        assert "".join(c.text for c in status.chunks if c.stream == "stdout") == "ready\n"
        assert elapsed < 0.7 + 2.0 + 1.0
        assert await self.survivors(sandbox, f"sleep {marker}.") == []

    async def test_background_job_holding_the_pipe_is_killed_after_exit(self, sandbox: Sandbox
                                                                        ) -> None:
        marker = f"{uuid.uuid4().int % 1000 + 2000}"
        request = sandbox.spawn(f"sleep {marker}.7 & echo done")
        status = await sandbox.backend.start(request)
        await sandbox.backend.release(request.job)
        assert (status.exit_code, status.output, status.timed_out) == (0, "done\n", False)
        assert status.leftovers_killed >= 1
        assert await self.survivors(sandbox, f"sleep {marker}.") == []

    async def test_flood_is_bounded_and_counted(self, sandbox: Sandbox) -> None:
        request = sandbox.spawn("yes", deadline_ms=1500, output_limit=64 * 1024)
        status = await sandbox.backend.start(request)
        await sandbox.backend.release(request.job)
        assert status.stdout_truncated and not status.stderr_truncated
        assert status.stdout_bytes > 10 * 64 * 1024
        kept = status.output.encode()
        assert len(kept) <= 64 * 1024
        assert kept.startswith(b"y\ny\n") and set(kept) <= set(b"y\n")

    @pytest.mark.parametrize("stream", ["stdout", "stderr"])
    async def test_flood_counts_are_exact_on_either_stream(self, sandbox: Sandbox, stream: str
                                                           ) -> None:
        redirect = " >&2" if stream == "stderr" else ""
        request = sandbox.spawn(f"head -c 3000000 /dev/zero | tr '\\0' a{redirect}",
                                output_limit=65536)
        status = await sandbox.backend.start(request)
        await sandbox.backend.release(request.job)
        other = "stdout" if stream == "stderr" else "stderr"
        counts = {"stdout": status.stdout_bytes, "stderr": status.stderr_bytes}
        flags = {"stdout": status.stdout_truncated, "stderr": status.stderr_truncated}
        assert counts[stream] == 3_000_000 and flags[stream] is True
        assert counts[other] == 0 and flags[other] is False
        kept = "".join(c.text for c in status.chunks if c.stream == stream)
        assert len(kept) == 65536 and set(kept) == {"a"}

    async def test_cancelled_call_kills_inside_the_sandbox(self, sandbox: Sandbox) -> None:
        marker = f"{uuid.uuid4().int % 1000 + 3000}"
        toolkit = Toolkit(sandbox.backend, base_dir=sandbox.base)
        task = asyncio.ensure_future(toolkit.call("bash", {"command": f"sleep {marker}.8"}))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await self.survivors(sandbox, f"sleep {marker}.") == []


class HostileContract(_Bound):
    """What a hostile (or merely unlucky) model or command does; the session lives on and
    nothing outlives its call. Needs real processes and the host dir (``HostDirContract``)."""

    async def _hostile_toolkit(self, sandbox: Sandbox, **settings: object) -> Toolkit:
        toolkit = Toolkit(sandbox.backend, base_dir=sandbox.base,
                          settings=Settings.model_validate(settings))
        await toolkit.open()
        return toolkit

    async def test_kill_minus_one_spares_the_session(self, sandbox: Sandbox) -> None:
        tk = await self._hostile_toolkit(sandbox)
        killed = await tk.call("bash", {"command": "sleep 30 & kill -9 -1; wait; echo after"})
        assert killed.output == "after\n", killed
        alive = await tk.call("bash", {"command": "echo alive"})
        assert (alive.output, alive.is_error) == ("alive\n", False)

    @pytest.mark.parametrize("escape", ["env -i setsid sleep {m} &",
                                        "unset TOOLSEAM_JOB_TOKEN; (setsid sleep {m} &)",
                                        "(TOOLSEAM_JOB_TOKEN=forged setsid sleep {m} &)"])
    async def test_a_process_that_sheds_its_marks_dies_with_its_call(
            self, sandbox: Sandbox, escape: str) -> None:
        """Job tracking rests on what the kernel keeps (parentage: each job's root, a
        subreaper), not on an environment variable a command can drop — also while another
        job runs."""
        tk = await self._hostile_toolkit(sandbox, timeout_policy="detach", default_timeout_ms=200)
        other = await tk.call("bash", {"command": "sleep 30"})
        assert other.metadata["detached"] is True
        marker = f"{uuid.uuid4().int % 900 + 100}.125"
        done = await tk.call("bash", {"command": escape.format(m=marker), "timeout": 10_000})
        assert not done.is_error, done.output
        deadline = time.monotonic() + 5
        while await self.survivors(sandbox, f"sleep {marker}") and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert await self.survivors(sandbox, f"sleep {marker}") == []
        still = await tk.call("bash", {"wait": 1, "timeout": 1})
        assert still.metadata.get("detached") or "still running" in still.output  # untouched
        await tk.close()

    @pytest.mark.parametrize(("args", "message"), [
        ({"command": "true", "timeout": 2**31},
         "bash: invalid input: timeout: must be <= 2147483647, got 2.14748e+09"),
        ({"command": "echo a\0b"}, "bash: invalid input: command must not contain a NUL byte"),
        ({"command": "true", "workdir": "a\0"},
         "bash: invalid input: workdir must not contain a NUL byte"),
    ])
    async def test_invalid_input_is_a_tool_error_and_the_session_lives(
            self, sandbox: Sandbox, args: dict[str, object], message: str) -> None:
        tk = await self._hostile_toolkit(sandbox)
        result = await tk.call("bash", args)
        assert (result.is_error, result.output) == (True, message)
        assert "failure" not in result.metadata
        assert (await tk.call("bash", {"command": "echo ok"})).output == "ok\n"

    async def test_catastrophic_regex_is_stopped_and_deadlines_keep_firing(
            self, sandbox: Sandbox) -> None:
        await sandbox.put({"a.txt": b"a" * 40 + b"!\n"})
        tk = await self._hostile_toolkit(sandbox, search_timeout_ms=1500)
        started = time.monotonic()
        grep, bash = await asyncio.gather(
            tk.call("grep", {"pattern": "(a+)+$"}),
            tk.call("bash", {"command": "sleep 30", "timeout": 300}))
        assert bash.metadata["timedOut"] is True and bash.metadata["durationMs"] < 1500
        assert grep.is_error and grep.output.startswith(
            "grep: the search took longer than 1500 ms and was stopped")
        assert time.monotonic() - started < 5
        assert (await tk.call("grep", {"pattern": "a!"})).output == "a.txt:1:" + "a" * 40 + "!"

    async def test_huge_lines_and_sparse_files_are_bounded(self, sandbox: Sandbox) -> None:
        host = sandbox.host_dir
        with open(host / "sparse.bin", "wb") as f:
            f.truncate(1 << 30)  # 1 GiB of NUL bytes that take no disk
        with open(host / "line.txt", "wb") as f:
            f.write(b"z" * (48 << 20) + b"\nend\n")  # a 48 MiB line
        for path in (host / "sparse.bin", host / "line.txt"):
            path.chmod(0o666)
        tk = await self._hostile_toolkit(sandbox)
        grep = await tk.call("grep", {"pattern": "^z+$|end"})
        assert grep.output == ("line.txt:1:" + "z" * 2000 + "\nline.txt:2:end\n\n"
                               "(1 matching line cut at 2000 characters)")
        assert grep.metadata["skippedBinary"] == 1
        read = await tk.call("read", {"path": "line.txt", "offset": 1, "limit": 1})
        assert read.output.startswith("00001| " + "z" * 2000 + "\n\n(line 1 cut at")
        binary = await tk.call("read", {"path": "sparse.bin"})
        assert binary.is_error and "binary" in binary.output
        assert (await tk.call("bash", {"command": "echo alive"})).output == "alive\n"

    async def test_a_base_dir_renamed_and_recreated_is_never_written_through(
            self, sandbox: Sandbox) -> None:
        """Operations follow the name, or fail closed — never into the old directory."""
        tk = await self._hostile_toolkit(sandbox)
        assert not (await tk.call("write", {"path": "before.txt", "content": "1"})).is_error
        host = sandbox.host_dir
        moved = host.with_name(host.name + "-moved")
        host.rename(moved)
        host.mkdir()
        host.chmod(0o777)
        try:
            result = await tk.call("write", {"path": "after.txt", "content": "2"})
            assert not (moved / "after.txt").exists()
            if result.is_error:  # failed closed (a bind mount pins the old directory)
                assert result.metadata["failure"] == "could_not_run"
                assert result.metadata["retryable"] is False
                assert "renamed, removed or replaced" in result.metadata["reason"]
            else:  # followed the name
                assert (host / "after.txt").read_text() == "2"
        finally:
            await tk.close()
            shutil.rmtree(moved, ignore_errors=True)

    async def test_a_name_a_listing_shows_is_a_usable_path(self, sandbox: Sandbox) -> None:
        r"""Undecodable bytes in names are shown as ``\xNN``; that text names the file."""
        host = os.fsencode(sandbox.host_dir)
        os.mkdir(host + b"/d\xff")
        with open(host + b"/d\xff/caf\xe9.txt", "wb") as f:
            f.write(b"one\n")
        os.chmod(host + b"/d\xff", 0o777)
        os.chmod(host + b"/d\xff/caf\xe9.txt", 0o666)
        tk = await self._hostile_toolkit(sandbox)
        listed = (await tk.call("glob", {"pattern": "**/*.txt"})).output
        assert listed == "d\\xff/caf\\xe9.txt"
        assert (await tk.call("grep", {"pattern": "one"})).output == "d\\xff/caf\\xe9.txt:1:one"
        read = await tk.call("read", {"path": listed})
        assert read.output.startswith("00001| one\n"), read.output
        edit = await tk.call("edit", {"path": listed, "oldString": "one", "newString": "two"})
        assert not edit.is_error, edit.output
        with open(host + b"/d\xff/caf\xe9.txt", "rb") as f:
            assert f.read() == b"two\n"
        new = await tk.call("write", {"path": "d\\xff/new.txt", "content": "x"})
        assert not new.is_error and os.path.exists(host + b"/d\xff/new.txt")

    @pytest.mark.parametrize("tool", ["write", "edit", "apply_patch"])
    async def test_read_only_files_are_refused(self, sandbox: Sandbox, tool: str) -> None:
        target = sandbox.host_dir / "ro.txt"
        target.write_text("keep\n")
        target.chmod(0o444)
        tk = await self._hostile_toolkit(sandbox)
        args: dict[str, str] = {
            "write": {"path": "ro.txt", "content": "x"},
            "edit": {"path": "ro.txt", "oldString": "keep", "newString": "x"},
            "apply_patch": {"patchText": "*** Begin Patch\n*** Update File: ro.txt\n@@\n-keep\n+x\n"
                                         "*** End Patch"}}[tool]
        result = await tk.call(tool, args)
        assert (result.is_error, result.output) == (True, f"{tool}: permission denied: ro.txt")
        assert target.read_text() == "keep\n" and target.stat().st_mode & 0o777 == 0o444


class HostDirContract(_Bound):
    """Symlinks, FIFOs and modes made directly in the host dir (local or bind-mounted)."""

    async def test_symlinks_are_neither_followed_nor_listed(self, sandbox: Sandbox) -> None:
        await sandbox.put({"real/f.txt": b"hit\n"})
        (sandbox.host_dir / "link-dir").symlink_to("real")
        (sandbox.host_dir / "link-file.txt").symlink_to("real/f.txt")
        listing = await sandbox.backend.list_files(sandbox.ref())
        assert sorted(listing.paths) == ["real/f.txt"]
        hits = await sandbox.backend.grep(sandbox.ref(), "hit")
        assert [h[0] for h in hits.hits] == ["real/f.txt"]

    async def test_symlink_escapes_are_refused(self, sandbox: Sandbox, tmp_path: Path) -> None:
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "secret.txt").write_text("secret")
        (sandbox.host_dir / "to-dir").symlink_to(outside)
        (sandbox.host_dir / "to-file").symlink_to(outside / "secret.txt")
        (sandbox.host_dir / "loop").symlink_to("loop")
        (sandbox.host_dir / "sub").mkdir()
        for path in ("to-dir/secret.txt", "to-file", "to-dir/", "to-dir/../outside/secret.txt", "loop",
                     "loop/x", "sub/../to-dir/secret.txt"):
            with pytest.raises(FileOpError) as caught:
                await sandbox.backend.read_text(sandbox.ref(path))
            assert caught.value.code == "outside_base", path
            with pytest.raises(FileOpError):
                await sandbox.backend.write(sandbox.ref(path + ("x" if path.endswith("/") else "")), b"x")
        assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
        assert (outside / "secret.txt").read_text() == "secret"

    async def test_fifo_is_refused_without_blocking(self, sandbox: Sandbox) -> None:
        os.mkfifo(sandbox.host_dir / "pipe")
        with pytest.raises(FileOpError) as caught:
            await asyncio.wait_for(sandbox.backend.read_text(sandbox.ref("pipe")), 5)
        assert caught.value.code == "not_regular"

    async def test_write_keeps_mode_and_leaves_no_temp_files(self, sandbox: Sandbox) -> None:
        target = sandbox.host_dir / "run.sh"
        target.write_text("old")
        target.chmod(0o751)
        await sandbox.backend.write(sandbox.ref("run.sh"), b"new")
        assert target.read_text() == "new"
        assert target.stat().st_mode & 0o777 == 0o751
        assert sorted(p.name for p in sandbox.host_dir.iterdir()) == ["run.sh"]


    async def test_unconfined_write_resolves_like_the_kernel(self, sandbox: Sandbox) -> None:
        """Unconfined, a write follows symlinks (leaf and parents) and ``..`` physically."""
        host = sandbox.host_dir
        await sandbox.put({"real/old.txt": b"old"})
        (host / "link-dir").symlink_to("real")
        (host / "link-file.txt").symlink_to("real/old.txt")

        def free(path: str) -> PathRef:
            return sandbox.ref(path, confine=False)

        assert (await sandbox.backend.write(free("link-file.txt"), b"via leaf")).created is False
        assert (host / "real/old.txt").read_bytes() == b"via leaf"
        assert (host / "link-file.txt").is_symlink()
        assert (await sandbox.backend.write(free("link-dir/new.txt"), b"via dir")).created is True
        assert (host / "real/new.txt").read_bytes() == b"via dir"
        await sandbox.backend.write(free("link-dir/../made/deep/n.txt"), b"up")  # .. of real/
        assert (host / "made/deep/n.txt").read_bytes() == b"up"
        for path, code in (("real", "is_directory"), ("real/old.txt/x", "not_directory"),
                           ("link-dir/", "is_directory"), ("real/..", "is_directory")):
            with pytest.raises(FileOpError) as caught:
                await sandbox.backend.write(free(path), b"x")
            assert caught.value.code == code, path
        left = sorted(str(p.relative_to(host)) for p in host.rglob("*"))
        assert left == ["link-dir", "link-file.txt", "made", "made/deep", "made/deep/n.txt",
                        "real", "real/new.txt", "real/old.txt"]


def _detach_settings(**overrides: object) -> Settings:
    fields: dict[str, object] = {"timeout_policy": "detach", "default_timeout_ms": 300,
                                 "max_jobs": 2, "job_max_ms": 30_000}
    fields.update(overrides)
    return Settings.model_validate(fields)


class JobContract(_Bound):
    """The detach policy and the bash job forms (CONTRACT §7), through a Toolkit."""

    async def _job_toolkit(self, sandbox: Sandbox, **overrides: object) -> Toolkit:
        toolkit = Toolkit(sandbox.backend, base_dir=sandbox.base, settings=_detach_settings(**overrides))
        await toolkit.open()
        return toolkit

    async def test_detach_then_wait_returns_a_fresh_result(self, sandbox: Sandbox) -> None:
        tk = await self._job_toolkit(sandbox)
        first = await tk.call("bash", {"command": "echo begin; sleep 0.8; echo end; exit 5"})
        assert first.output.startswith("still running after 300 ms (job 1) — output so far below;")
        assert first.output.endswith("\nbegin\n") and not first.is_error
        assert first.metadata["detached"] is True and first.metadata["jobId"] == 1
        assert isinstance(first.metadata["pid"], int)
        done = await tk.call("bash", {"wait": 1, "timeout": 5000})
        assert done.output == "begin\nend\n\nbash: command exited with code 5"
        assert done.metadata["jobId"] == 1 and done.metadata["exitCode"] == 5

    async def test_wait_that_elapses_says_still_running(self, sandbox: Sandbox) -> None:
        tk = await self._job_toolkit(sandbox)
        await tk.call("bash", {"command": "sleep 5"})
        again = await tk.call("bash", {"wait": 1, "timeout": 100})
        assert again.output.startswith("still running after ") and "(job 1)" in again.output
        killed = await tk.call("bash", {"kill": 1})
        assert killed.output.startswith("killed job 1") and killed.metadata["killedTree"] is True

    async def test_a_cancelled_wait_leaves_the_job_running(self, sandbox: Sandbox) -> None:
        tk = await self._job_toolkit(sandbox)
        await tk.call("bash", {"command": "sleep 5"})
        waiting = asyncio.ensure_future(tk.call("bash", {"wait": 1, "timeout": 30_000}))
        await asyncio.sleep(0.2)
        started = time.monotonic()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert time.monotonic() - started < 0.5
        listing = await tk.call("bash", {"jobs": True})
        assert [(j["id"], j["state"]) for j in listing.metadata["jobs"]] == [(1, "running")]
        await tk.call("bash", {"kill": 1})

    async def test_explicit_timeout_still_kills(self, sandbox: Sandbox) -> None:
        tk = await self._job_toolkit(sandbox)
        result = await tk.call("bash", {"command": "sleep 5", "timeout": 200})
        assert result.output.startswith("bash: command timed out after 200ms")

    async def test_end_of_turn_kills_unkept_jobs_only(self, sandbox: Sandbox) -> None:
        tk = await self._job_toolkit(sandbox)
        await tk.call("bash", {"command": "sleep 5"})
        await tk.call("bash", {"command": "sleep 5", "keep": True})
        assert await tk.end_turn() == [1]
        listing = await tk.call("bash", {"jobs": True})
        assert [(j["id"], j["state"]) for j in listing.metadata["jobs"]] == [(1, "killed"), (2, "running")]
        await tk.close()
        assert all(j.state == "killed" for j in tk.services.jobs.all())

    async def test_max_jobs_evicts_the_oldest_unkept(self, sandbox: Sandbox) -> None:
        tk = await self._job_toolkit(sandbox)
        await tk.call("bash", {"command": "sleep 5", "keep": True})
        await tk.call("bash", {"command": "sleep 5"})
        third = await tk.call("bash", {"command": "sleep 5"})
        assert "\nstopped job 2 (sleep 5): at most 2 jobs run at once\n" in third.output
        assert third.metadata["evictedJobId"] == 2
        fourth = await tk.call("bash", {"command": "sleep 5", "keep": True})
        assert fourth.metadata["evictedJobId"] == 3
        fifth = await tk.call("bash", {"command": "sleep 5"})  # all running ones are kept now
        assert fifth.metadata["evictedJobId"] == 1

    async def test_max_jobs_counts_only_running_jobs(self, sandbox: Sandbox) -> None:
        """A job that ended on its own costs no running job its life."""
        tk = await self._job_toolkit(sandbox)
        await tk.call("bash", {"command": "sleep 0.5"})  # detaches at 300 ms, ends by itself
        await tk.call("bash", {"command": "sleep 5"})
        await asyncio.sleep(0.6)
        third = await tk.call("bash", {"command": "sleep 5"})
        assert "evictedJobId" not in third.metadata, third.output
        listed = await tk.call("bash", {"jobs": True})
        states = {job["id"]: job["state"] for job in listed.metadata["jobs"]}
        assert states == {1: "exited", 2: "running", 3: "running"}

    async def test_ceiling_kills_a_detached_job(self, sandbox: Sandbox) -> None:
        tk = await self._job_toolkit(sandbox, job_max_ms=700)
        await tk.call("bash", {"command": "echo x; sleep 30"})
        done = await tk.call("bash", {"wait": 1, "timeout": 5000})
        assert done.output == "bash: command timed out after 700ms\nx\n"

    @pytest.mark.parametrize(("args", "message"), [
        ({"command": "true", "wait": 1}, "bash: invalid input: use exactly one form: {command}, "
         "{wait: id}, {kill: id} or {jobs: true} (got: command, wait)"),
        ({"kill": 1, "keep": True}, "bash: invalid input: keep cannot be used with the kill form"),
        ({"wait": 9}, "bash: no job 9; {\"jobs\": true} lists this session's jobs"),
        ({"jobs": True, "other": 1}, "bash: invalid input: unknown field 'other'"),
    ])
    async def test_forms_are_validated(self, sandbox: Sandbox, args: dict[str, object],
                                       message: str) -> None:
        tk = await self._job_toolkit(sandbox)
        result = await tk.call("bash", args)
        assert result.is_error and result.output == message


class RawContract(_Bound):
    """The raw sandbox API (``Toolkit.sandbox``, ``toolseam.session.raw``): argv exec with stdin, cwd,
    env, user, timeout and output limits; whole-file bytes. Needs real processes. A binding
    sets ``switches_user``: whether its sandbox can run commands as another user."""

    switches_user = False

    @pytest_asyncio.fixture
    async def raw(self, sandbox: Sandbox) -> AsyncIterator[RawSandbox]:
        toolkit = Toolkit(sandbox.backend, base_dir=sandbox.base, tools={"bash": False})
        await toolkit.open()
        yield toolkit.sandbox

    async def test_argv_is_never_parsed_by_a_shell(self, raw: RawSandbox) -> None:
        words = ["a b", "$HOME", "`id`", "'q'", "\\", "*", ""]
        done = await raw.exec(["printf", "[%s]", *words])
        assert done.success and done.stdout == "".join(f"[{w}]" for w in words)

    async def test_stdin_round_trips_bytes_and_text(self, raw: RawSandbox) -> None:
        payload = b"\xc3\x28\x00\xff\x01 $HOME `id`\n"
        assert (await raw.exec(["sh", "-c", "cat > in.bin"], stdin=payload)).success
        assert await raw.read_bytes("in.bin") == payload
        assert (await raw.exec(["cat"], stdin="héllo\n")).stdout == "héllo\n"
        assert (await raw.exec(["cat"], stdin="")).stdout == ""
        big = await raw.exec(["wc", "-c"], stdin=b"a" * (8 << 20))
        assert big.stdout.split() == [str(8 << 20)]
        leftovers = await raw.exec(["sh", "-c", "ls -a /tmp | grep toolseam-stdin || true"])
        assert leftovers.stdout == ""  # each stdin file is gone once its job holds it

    async def test_no_stdin_reads_end_of_file(self, raw: RawSandbox) -> None:
        done = await raw.exec(["cat"], timeout=5)
        assert done.success and done.stdout == "" and not done.timed_out

    async def test_cwd_env_and_exit_status(self, raw: RawSandbox, sandbox: Sandbox) -> None:
        await raw.write_bytes("sub/f.txt", b"x")
        assert (await raw.exec(["ls"], cwd="sub")).stdout == "f.txt\n"
        assert (await raw.exec(["pwd"], cwd="/tmp")).stdout == "/tmp\n"
        assert (await raw.exec(["pwd"])).stdout == sandbox.base + "\n"
        with pytest.raises(FileNotFoundError):
            await raw.exec(["true"], cwd="missing")
        done = await raw.exec(["sh", "-c", 'echo "$A-$B"; echo err >&2; exit 3'],
                              env={"A": "1", "B": "two words"})
        assert (done.stdout, done.stderr, done.exit_code, done.signal) == (
            "1-two words\n", "err\n", 3, None)
        killed = await raw.exec(["sh", "-c", "kill -TERM $$"])
        assert (killed.exit_code, killed.signal, killed.success) == (None, signal.SIGTERM, False)

    async def test_missing_and_unexecutable_programs(self, raw: RawSandbox) -> None:
        missing = await raw.exec(["no-such-program-here"])
        assert missing.exit_code == 127 and "no-such-program-here" in missing.stderr
        await raw.write_bytes("plain.txt", b"not a program")
        with pytest.raises(PermissionError):
            await raw.exec(["./plain.txt"])

    async def test_timeout_kills_the_whole_job(self, raw: RawSandbox) -> None:
        marker = uuid.uuid4().hex[:12]
        started = time.monotonic()
        done = await raw.exec(["sh", "-c", f"sleep 30 # {marker} & sleep 31 # {marker}; :"],
                              timeout=0.5)
        assert done.timed_out and not done.success and time.monotonic() - started < 10
        alive = await raw.exec(["sh", "-c", f"cat /proc/[0-9]*/cmdline | tr '\\0' ' ' "
                                            f"| grep -c '{marker}' || true"])
        assert alive.stdout.strip() == "1"  # only the grep's own shell line, no sleep

    async def test_output_limit_per_stream_with_a_flag(self, raw: RawSandbox) -> None:
        done = await raw.exec(["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' a; echo e >&2"],
                              output_limit=1000)
        assert done.stdout_truncated and not done.stderr_truncated
        assert (done.stdout_bytes, len(done.stdout), done.stderr) == (100000, 1000, "e\n")

    async def test_user_is_switched_or_refused_clearly(self, raw: RawSandbox) -> None:
        me = (await raw.exec(["id", "-u"])).stdout.strip()
        assert (await raw.exec(["id", "-u"], user=me)).stdout.strip() == me
        with pytest.raises(UnknownUserError, match="no-such-user"):
            await raw.exec(["id"], user="no-such-user")
        if self.switches_user:
            done = await raw.exec(["sh", "-c", "id -u; echo $HOME $X"], user="nobody",
                                  env={"X": "kept"})
            assert done.stdout.split()[0] == "65534" and done.stdout.split()[2] == "kept"
        else:
            with pytest.raises(UserUnsupportedError, match="cannot run as user 'nobody'"):
                await raw.exec(["id"], user="nobody")

    async def test_whole_files_and_their_errors(self, raw: RawSandbox) -> None:
        data = bytes(range(256)) * 1000
        await raw.write_bytes("deep/er/file.bin", data)
        assert await raw.read_bytes("deep/er/file.bin") == data
        await raw.write_bytes("deep/er/file.bin", "text")
        assert await raw.read_bytes("deep/er/file.bin") == b"text"
        with pytest.raises(FileNotFoundError, match="nope"):
            await raw.read_bytes("nope")
        with pytest.raises(IsADirectoryError):
            await raw.read_bytes("deep")
        with pytest.raises(IsADirectoryError):
            await raw.write_bytes("deep", b"x")
        with pytest.raises(FileLimitError):
            await raw.read_bytes("deep/er/file.bin", limit=2)
        await raw.exec(["chmod", "a-w", "deep/er/file.bin"])
        with pytest.raises(PermissionError):
            await raw.write_bytes("deep/er/file.bin", b"y")
        assert await raw.read_bytes("deep/er/file.bin") == b"text"

    async def test_bad_arguments_are_value_errors(self, raw: RawSandbox) -> None:
        for argv in ([], "ls -l", ["a\0b"], [""]):
            with pytest.raises(ValueError):
                await raw.exec(argv)
        with pytest.raises(ValueError, match="env"):
            await raw.exec(["true"], env={"A=B": "x"})
        with pytest.raises(ValueError, match="timeout"):
            await raw.exec(["true"], timeout=0)
