"""Engines that share no filesystem with this host (scripts/setup-remote-engines.sh): docker over
TLS and podman's API service over TCP, each in a private mount namespace. The sandbox works on
a copy of the base dir; these tests look at the host dir after close, at the failure paths and
at the files moved by hand. The contract suite over both is in test_contract_containers.py."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from toolseam import Settings, Toolkit
from toolseam.backends.containers.backend import resolve_mode
from toolseam.backends.containers.engine.attach import TlsFiles
from toolseam.backends.containers.engine.protocol import Hardening
from toolseam.backends.containers.labels import OWNER_LABEL
from toolseam.backends.docker import DockerBackend, DockerEngine
from toolseam.backends.podman import PodmanBackend, PodmanEngine
from toolseam.builtins._base import OutputEvent
from toolseam.policy.limits import SandboxLimits
from toolseam.seam.errors import CouldNotRunError

from ..support.engines import REMOTE_ENGINES, backend, endpoint, required_env
from ..support.timing import patience

pytestmark = pytest.mark.slow


@pytest.fixture
def base(workspace: Path) -> Path:
    return workspace


def engine_of(name: str) -> DockerEngine | PodmanEngine:
    if name == "docker-remote":
        tls = TlsFiles.from_dir(required_env("TOOLSEAM_REMOTE_DOCKER_CERT_PATH", name))
        return DockerEngine(endpoint(name), tls)
    return PodmanEngine(endpoint(name))


def host_tree(root: Path) -> dict[str, str]:
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            mode = oct(path.lstat().st_mode & 0o777)
            if path.is_symlink():
                found[rel] = f"l {os.readlink(path)}"
            elif path.is_dir():
                found[rel] = f"d {mode}"
            else:
                found[rel] = f"f {mode} {hashlib.sha256(path.read_bytes()).hexdigest()}"
    return found


# The same listing, made inside the sandbox by the image's own tools.
SANDBOX_TREE = r"""find . -mindepth 1 | sort | while read -r p; do
  r=${p#./}
  if [ -L "$p" ]; then echo "$r	l $(readlink "$p")"
  elif [ -d "$p" ]; then echo "$r	d 0o$(stat -c %a "$p")"
  else echo "$r	f 0o$(stat -c %a "$p") $(sha256sum < "$p" | cut -d' ' -f1)"; fi
done"""


async def sandbox_tree(tk: Toolkit) -> dict[str, str]:
    out = (await tk.call("bash", {"command": SANDBOX_TREE, "timeout": 60_000})).output
    return dict(line.split("\t", 1) for line in out.splitlines() if line)


@pytest.mark.parametrize("engine", REMOTE_ENGINES)
async def test_no_host_path_exists_for_the_engine(engine: str, base: Path) -> None:
    """What makes these engines stand-ins for other machines: a bind mount of a host dir fails."""
    made = backend(engine, str(base), workspace_mode="bind")
    with pytest.raises(CouldNotRunError) as caught:
        await made.open()
    await made.close()
    reason = caught.value.reason
    assert "bind source path does not exist" in reason or "no such file or directory" in reason


@pytest.mark.parametrize("engine", REMOTE_ENGINES)
async def test_the_base_dir_is_left_exactly_as_the_sandbox_left_it(engine: str, base: Path,
                                                                   tmp_path: Path) -> None:
    (base / "keep.txt").write_text("unchanged\n")
    (base / "edit.txt").write_text("alpha\nbeta\n")
    (base / "patch.txt").write_text("one\ntwo\n")
    (base / "old").mkdir()
    (base / "old" / "gone.txt").write_text("bye\n")
    (base / "link").symlink_to("keep.txt")
    marker = f"toolseam-outside-{uuid.uuid4().hex[:8]}"
    tk = Toolkit(backend(engine, str(base)),
                 settings=Settings(timeout_policy="detach", default_timeout_ms=300))
    events: list[Any] = []
    try:
        info = await tk.open()
        assert info.workspace == "/workspace" and not info.local
        assert (await tk.call("read", {"path": "edit.txt"})).output.startswith("00001| alpha")
        calls = [
            ("write", {"path": "new/deep/file.txt", "content": "made\n"}),
            ("edit", {"path": "edit.txt", "oldString": "beta", "newString": "gamma"}),
            ("apply_patch", {"patchText": "*** Begin Patch\n*** Update File: patch.txt\n"
                                          "*** Move to: moved.txt\n@@\n-two\n+three\n"
                                          "*** End Patch"}),
            ("bash", {"command": f"rm -r old && mkdir -p bin && printf '#!/bin/sh\\n' > bin/run "
                                 f"&& chmod 755 bin/run && ln -s bin/run run-link && ln -s /tmp "
                                 f"up && echo x > up/{marker} && rm link", "timeout": 60_000}),
        ]
        for name, args in calls:
            result = await tk.call(name, args)
            assert not result.is_error, (name, result.output)
        job = await tk.call("bash", {"command": "sleep 1; echo late > late.txt; echo done"})
        assert job.metadata.get("detached") is True, job
        async for event in tk.call_stream("bash", {"command": "for i in 1 2 3; do echo $i; "
                                                   "sleep 0.05; done; echo end > streamed.txt",
                                                   "timeout": 60_000}):
            events.append(event)
        waited = await tk.call("bash", {"wait": job.metadata["jobId"], "timeout": 60_000})
        assert waited.output == "done\n" and waited.metadata["exitCode"] == 0, waited
        globbed = (await tk.call("glob", {"pattern": "**/*.txt"})).output.splitlines()
        assert sorted(globbed) == ["edit.txt", "keep.txt", "late.txt", "moved.txt",
                                   "new/deep/file.txt", "streamed.txt"]
        grep = await tk.call("grep", {"pattern": "gamma|three"})
        assert sorted(grep.output.splitlines()) == ["edit.txt:2:gamma", "moved.txt:2:three"]
        inside = await sandbox_tree(tk)
    finally:
        await tk.close()
    live = [e for e in events if isinstance(e, OutputEvent)]
    assert "".join(e.text for e in live) == "1\n2\n3\n" and len(live) >= 2
    assert host_tree(base) == inside, (tk.backend.sandbox.last_sync, os.listdir(base))  # type: ignore[attr-defined]
    assert (base / "moved.txt").read_text() == "one\nthree\n" and not (base / "patch.txt").exists()
    assert os.readlink(base / "up") == "/tmp" and not Path("/tmp", marker).exists()
    assert tk.backend.sandbox.last_sync is not None  # type: ignore[attr-defined]


@pytest.mark.parametrize("engine", REMOTE_ENGINES)
async def test_sync_brings_changes_home_while_running_and_keeps_both_sides_of_a_conflict(
        engine: str, base: Path) -> None:
    (base / "shared.txt").write_text("base\n")
    (base / "mine.txt").write_text("base\n")
    async with Toolkit(backend(engine, str(base))) as tk:
        await tk.call("bash", {"command": "echo sandbox > shared.txt; echo sandbox > mine.txt; "
                               "echo new > fresh.txt"})
        (base / "shared.txt").write_text("host edit\n")  # the host edits during the session
        report = await tk.sync()
        assert sorted(report.added) == ["fresh.txt"]
        assert report.modified == ["mine.txt"] and report.conflicts == ["shared.txt"]
        assert (base / "mine.txt").read_text() == "sandbox\n"
        assert (base / "shared.txt").read_text() == "host edit\n"
        assert (base / "shared.txt.toolseam-conflict").read_text() == "sandbox\n"
        again = await tk.sync()
        assert not again.changed
        await tk.call("bash", {"command": "rm fresh.txt"})
    assert not (base / "fresh.txt").exists()


@pytest.mark.parametrize("engine", REMOTE_ENGINES)
async def test_upload_and_download(engine: str, base: Path, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "data.csv").write_text("a,b\n")
    (inputs / "tool.sh").write_text("#!/bin/sh\necho tool ran\n")
    (inputs / "tool.sh").chmod(0o755)
    (inputs / "alias").symlink_to("tool.sh")
    (tmp_path / "untouched.txt").write_text("input\n")
    async with Toolkit(backend(engine, str(base))) as tk:
        await tk.upload(str(inputs), "inputs")
        await tk.upload(str(tmp_path / "untouched.txt"), "untouched.txt")
        ran = await tk.call("bash", {"command": "./inputs/alias && cat inputs/data.csv && "
                                     "echo out > result.txt && echo more >> inputs/data.csv"})
        assert ran.output == "tool ran\na,b\n"
        await tk.download("result.txt", str(tmp_path / "result.txt"))
        await tk.download("inputs", str(tmp_path / "inputs-back"))
        with pytest.raises(Exception, match="already exists"):
            await tk.download("result.txt", str(tmp_path / "result.txt"))
    assert (tmp_path / "result.txt").read_text() == "out\n"
    assert (tmp_path / "inputs-back" / "data.csv").read_text() == "a,b\nmore\n"
    assert os.readlink(tmp_path / "inputs-back" / "alias") == "tool.sh"
    # an upload is the sandbox's own: it comes home only where the sandbox changed it
    assert not (base / "untouched.txt").exists()
    assert (base / "inputs" / "data.csv").read_text() == "a,b\nmore\n"
    assert not (base / "inputs" / "tool.sh").exists()
    assert (base / "result.txt").read_text() == "out\n"


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_past_the_copy_limit_nothing_is_written_and_the_container_is_kept(
        base: Path) -> None:
    engine = "podman-remote"
    (base / "a.txt").write_text("base\n")
    made = backend(engine, str(base), copy_limit=100_000)
    tk = Toolkit(made)
    await tk.open()
    container = made.sandbox.container  # type: ignore[attr-defined]
    await tk.call("bash", {"command": "head -c 300000 /dev/zero > big.bin; echo x > a.txt"})
    with pytest.raises(CouldNotRunError, match="larger than the copy limit") as caught:
        await tk.sync()
    assert not caught.value.retryable
    with pytest.raises(CouldNotRunError, match=f"container {container[:12]} and its workspace "
                                               "volume are kept for 7 days"):
        await tk.close()
    assert sorted(p.name for p in base.iterdir()) == ["a.txt"]
    assert (base / "a.txt").read_text() == "base\n"
    client = engine_of(engine)
    try:
        assert client.state(container).status in ("exited", "stopped")  # podman: either, by timing
        with client.get_archive(container, "/workspace/a.txt") as chunks:
            assert b"x\n" in b"".join(chunks)
    finally:
        client.remove(container)
        client.remove_volume(f"toolseam-ws-{made.sandbox.session_id}")  # type: ignore[attr-defined]
        client.remove_volume(f"toolseam-kept-{made.sandbox.session_id}")  # type: ignore[attr-defined]
        client.close()


class _Proxy:
    """A TCP relay to an engine that can cut every connection at once, as a dropped network,
    and come back on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", self.port,
                                                 reuse_address=True)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        with contextlib.suppress(asyncio.CancelledError):  # cut() or the loop's end
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    async def cut(self) -> None:
        """Reset every connection, as a network that fails does (no orderly close)."""
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            sock = writer.transport.get_extra_info("socket")
            if sock is not None and sock.fileno() >= 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        self.writers.clear()
        await self.server.wait_closed()


@pytest.mark.parametrize("engine", REMOTE_ENGINES)
async def test_a_dropped_engine_connection_is_retryable_and_the_session_reconnects(
        engine: str, base: Path) -> None:
    url = endpoint(engine)
    host, _, port = url.removeprefix("tcp://").rpartition(":")
    proxy = _Proxy((host, int(port)))
    relay = await proxy.start()
    made = backend(engine, str(base), endpoint=f"tcp://127.0.0.1:{relay}")
    async with Toolkit(made) as tk:
        await tk.call("bash", {"command": "echo before > before.txt"})
        call = asyncio.create_task(tk.call("bash", {"command": "sleep 30"}))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await proxy.cut()
        result = await asyncio.wait_for(call, 20)
        assert time.monotonic() - started < 15
        assert result.metadata["failure"] == "could_not_run", result
        assert result.metadata["retryable"] is True, result
        while_down = await tk.call("bash", {"command": "echo hi"})
        assert while_down.metadata["retryable"] is True
        assert "unreachable" in while_down.metadata["reason"]
        await proxy.start()  # the network is back
        again = await tk.call("bash", {"command": "echo back > back.txt; cat back.txt"})
        if engine == "docker-remote":  # the same agent, on a new attach stream
            assert again.output == "back\n", again
        else:
            # podman closes a container's stdin when any attach ends: the agent exits. While it
            # is still exiting, a call can meet it alive, then lose it — retryable; once the
            # engine reports it stopped, the session is over, and says why.
            for _ in range(20):
                if again.metadata.get("retryable") is not True:
                    break
                assert again.metadata["failure"] == "could_not_run", again
                await asyncio.sleep(0.25)
                again = await tk.call("bash", {"command": "echo back > back.txt"})
            assert again.metadata["retryable"] is False, again
            assert "the engine closed the agent's input" in again.metadata["reason"]
    assert (base / "before.txt").read_text() == "before\n"  # home at close, either way
    if engine == "docker-remote":
        assert (base / "back.txt").read_text() == "back\n"
    await proxy.cut()


@pytest.mark.parametrize("engine", REMOTE_ENGINES)
async def test_the_janitor_removes_volumes_of_dead_owners(engine: str, base: Path) -> None:
    client = engine_of(engine)
    orphan = f"toolseam-ws-orphan{uuid.uuid4().hex[:6]}"
    client.create_volume(orphan, {OWNER_LABEL: f"{os.uname().nodename}:999999999:1.000"})
    try:
        async with Toolkit(backend(engine, str(base))):
            pass
        assert not client.volume_exists(orphan)
    finally:
        client.remove_volume(orphan)
        client.close()


@pytest.mark.engines  # needs an engine without naming it in a parameter
def test_a_remote_engine_over_the_cli_leaves_the_base_dir_as_the_session_left_it(
        base: Path) -> None:
    url = endpoint("docker-remote")
    env = {**os.environ, "DOCKER_CERT_PATH": required_env("TOOLSEAM_REMOTE_DOCKER_CERT_PATH", ""),
           "DOCKER_TLS_VERIFY": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "toolseam.frontends.cli", "call", "bash",
         json.dumps({"command": "echo from-cli > cli.txt"}), "--backend", "docker",
         "--endpoint", url, "--image", required_env("TOOLSEAM_REMOTE_IMAGE", ""),
         "--workspace", str(base)], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (base / "cli.txt").read_text() == "from-cli\n"


@pytest.mark.engines  # needs an engine without naming it in a parameter
def test_serve_with_a_remote_engine_leaves_the_base_dir_as_the_session_left_it(
        base: Path) -> None:
    request = {"id": 1, "tool": "write", "args": {"path": "served.txt", "content": "served\n"}}
    done = subprocess.run(
        [sys.executable, "-m", "toolseam.frontends.cli", "serve", "--stdio", "--backend", "podman",
         "--endpoint", endpoint("podman-remote"), "--image", required_env("TOOLSEAM_REMOTE_IMAGE", ""),
         "--workspace", str(base)], input=json.dumps(request) + "\n", capture_output=True,
        text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["result"]["is_error"] for a in answers if a.get("id") == 1] == [False], done.stdout
    assert (base / "served.txt").read_text() == "served\n"


@pytest.mark.parametrize("engine", REMOTE_ENGINES)
async def test_oom_is_reported_remotely(engine: str, base: Path) -> None:
    made = backend(engine, str(base), hardening=Hardening(limits=SandboxLimits(memory="160m")))
    async with Toolkit(made) as tk:
        hog = await tk.call("bash", {"command": "python3 -c \"x = b'a' * (600 << 20)\"; "
                                                "echo after"})
        assert hog.metadata.get("oomKilled") is True, hog
        assert hog.output.endswith("after\n") and "failure" not in hog.metadata
        assert not (await tk.call("bash", {"command": "true"})).is_error


def test_the_mode_rule() -> None:
    """auto: bind for a unix socket, copy over the network; either can be forced."""
    unix, tcp = "unix:///run/x.sock", "tcp://127.0.0.1:1"
    assert resolve_mode("auto", PodmanEngine(unix)) == "bind"
    assert resolve_mode("auto", PodmanEngine(tcp)) == "copy"
    assert resolve_mode("auto", DockerEngine("https://example.invalid:2376")) == "copy"
    assert resolve_mode("copy", DockerEngine(unix)) == "copy"
    assert resolve_mode("bind", DockerEngine(tcp)) == "bind"
    assert DockerBackend(".", endpoint=tcp).workspace_mode == "copy"
    with pytest.raises(Exception, match="workspace_mode must be one of auto, bind, copy"):
        DockerBackend(".", endpoint=tcp, workspace_mode="mount")  # type: ignore[arg-type]
    assert resolve_mode("auto", DockerEngine("ssh://user@builder")) == "copy"  # a tunnel's end
    assert resolve_mode("auto", PodmanEngine("ssh://builder:2200/run/user/1000/podman.sock")
                        ) == "copy"
    with pytest.raises(CouldNotRunError, match="cannot carry the agent's channel"):
        DockerEngine("npipe:////./pipe/docker_engine")


@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_copy_mode_on_a_local_engine(engine: str, base: Path) -> None:
    """The override: a local engine in copy mode (the channel is the attach stream over the
    unix socket)."""
    (base / "in.txt").write_text("in\n")
    made = backend(engine, str(base), workspace_mode="copy")
    async with Toolkit(made) as tk:
        assert made.workspace_mode == "copy"  # type: ignore[attr-defined]
        result = await tk.call("bash", {"command": "cat in.txt; echo out > out.txt"})
        assert result.output == "in\n"
        assert not (base / "out.txt").exists()  # not shared: home at sync or close
    assert (base / "out.txt").read_text() == "out\n"


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_a_wrong_client_certificate_is_refused_clearly(base: Path, tmp_path: Path) -> None:
    certs = Path(required_env("TOOLSEAM_REMOTE_DOCKER_CERT_PATH", "remote docker"))
    (tmp_path / "ca.pem").write_bytes((certs / "ca.pem").read_bytes())  # no client certificate
    made = DockerBackend(str(base), image=required_env("TOOLSEAM_REMOTE_IMAGE", ""),
                         endpoint=endpoint("docker-remote"), tls=TlsFiles.from_dir(str(tmp_path)))
    with pytest.raises(CouldNotRunError, match=re.escape(endpoint("docker-remote"))) as caught:
        await made.open()
    await made.close()
    assert caught.value.retryable


@pytest.mark.parametrize("engine", REMOTE_ENGINES)
async def test_an_engine_over_ssh(engine: str, base: Path) -> None:
    """ssh://host as docker's and podman's clients take it: the system's ssh, configured in
    ~/.ssh/config (scripts/setup-remote-engines.sh adds the Host entries), forwards the remote
    engine's unix socket; the session works on a copy, and the tunnel ends with it."""
    variable = "TOOLSEAM_REMOTE_DOCKER_SSH_URL" if engine == "docker-remote" else \
        "TOOLSEAM_REMOTE_PODMAN_SSH_URL"
    url = required_env(variable, "the ssh endpoints")
    (base / "in.txt").write_text("over ssh\n")
    image = required_env("TOOLSEAM_REMOTE_IMAGE", "")
    made = (DockerBackend(str(base), image=image, endpoint=url) if engine == "docker-remote"
            else PodmanBackend(str(base), image=image, endpoint=url))
    assert made.workspace_mode == "copy"
    async with Toolkit(made) as tk:
        result = await tk.call("bash", {"command": "cat in.txt; echo back > out.txt"})
        assert result.output == "over ssh\n", result
        tunnel = made.sandbox.engine.tunnel
        assert tunnel is not None and os.path.exists(tunnel.local_socket)
    assert (base / "out.txt").read_text() == "back\n"
    assert not os.path.exists(tunnel.local_socket)
    host = url.removeprefix("ssh://").split("/", 1)[0]
    wrong = DockerBackend(str(base), endpoint=f"ssh://{host}:1/run/x.sock")
    with pytest.raises(CouldNotRunError, match=f"ssh tunnel to ssh://{host}:1"):
        await wrong.open()
    await wrong.close()


@pytest.mark.parametrize("engine_refuses", [False, True])
async def test_a_reattach_that_meets_a_stopped_container_ends_the_session(
        base: Path, monkeypatch: pytest.MonkeyPatch, engine_refuses: bool) -> None:
    """podman ends the agent when an attach ends; if it stops between the engine's "running"
    and the new attach, that attach is upgraded and then held open for a start that never
    comes. A call on it waited forever (a rehearsal hung 37 min in the dropped-connection test
    above); the session must end instead, saying why. The race is made certain here: the
    reattach's first state read is the one from before the drop. ``engine_refuses``: the
    engine answers that attach "container state improper" instead (seen under a CPU hog in
    rehearsal 19, where the call then failed as retryable)."""
    engine = "podman-remote"
    host, _, port = endpoint(engine).removeprefix("tcp://").rpartition(":")
    proxy = _Proxy((host, int(port)))
    relay = await proxy.start()
    made = backend(engine, str(base), endpoint=f"tcp://127.0.0.1:{relay}")
    async with Toolkit(made) as tk:
        await tk.call("bash", {"command": "echo before > before.txt"})
        sandbox = made.sandbox  # type: ignore[attr-defined]
        stale = await sandbox.state()
        assert stale is not None and stale.running
        await proxy.cut()
        await proxy.start()
        deadline = time.monotonic() + patience(30)
        while (now := await sandbox.state()) is not None and now.running:
            assert time.monotonic() < deadline, "the engine never stopped the agent"
            await asyncio.sleep(0.1)
        real, first = sandbox.state, [stale]

        async def stale_first() -> object:
            return first.pop() if first else await real()
        monkeypatch.setattr(sandbox, "state", stale_first)
        if engine_refuses:
            async def refused(_sandbox: object) -> None:
                raise CouldNotRunError("the engine refused to attach: HTTP/1.1 500 Internal "
                                       "Server Error (container state improper)",
                                       retryable=True)
            monkeypatch.setattr(sandbox.mode, "_attach", refused)
        result = await asyncio.wait_for(tk.call("bash", {"command": "echo hi"}), patience(60))
        assert result.metadata.get("retryable") is False, result
        assert "the engine closed the agent's input" in result.metadata["reason"], result
    assert (base / "before.txt").read_text() == "before\n"
    await proxy.cut()
