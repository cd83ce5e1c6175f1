"""Starting the sandbox agent, whatever the sandbox, and getting a channel to it.

* ``agent_command`` — the ``python -c`` arguments that run the agent package from a directory
  (the host runs it from this package; a container from a read-only mount of a staged copy).
* ``stage_agent`` / ``stage_bundle`` — a world-readable copy of it (with a runtime), for
  container engines to mount, in a directory only this user can change (``staging.py``).
* ``LocalAgent`` — the host's agent: a child process on a socketpair, in a private pid
  namespace when the system allows one; ``start`` hands back its ``AgentChannel``.

A container's agent is started by its engine (``_container_sandbox.py``: the container's first
program is ``agent_command``) and reached with ``AgentChannel.connect`` on a socket in a
bind-mounted directory. Either way the session ends with ``AgentChannel.shutdown``.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ..seam.errors import CouldNotRunError
from . import staging
from ._channel import AgentChannel
from ._workspace_copy import as_root
from .agent import wire

AGENT_PARENT = str(Path(__file__).resolve().parent)  # holds the agent/ package
_START_TIMEOUT_S = 10.0


def agent_command(parent: str) -> list[str]:
    """``python -c`` arguments that run the agent package found in ``parent``."""
    code = (f"import sys; sys.path.insert(0, {parent!r}); "
            "from agent.server import main; main()")
    return ["-I", "-S", "-c", code]


def stage_agent() -> str:
    """A world-readable copy of the agent package (a rootless engine cannot read a 0700 home),
    in this user's staging root (``staging.py``), verified before reuse."""
    sources = sorted(Path(AGENT_PARENT, "agent").glob("*.py"))
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sources)).hexdigest()[:16]
    root = staging.staging_root()
    staged = root / f"agent-{digest}"
    if staging.verified(staged) and all(
            (staged / "agent" / p.name).read_bytes() == p.read_bytes() for p in sources):
        return str(staged)
    work = Path(tempfile.mkdtemp(prefix=".agent-stage-", dir=root))
    try:
        (work / "agent").mkdir()
        for source in sources:
            shutil.copyfile(source, work / "agent" / source.name)
        for path in (work, work / "agent"):
            path.chmod(0o755)
        for path in (work / "agent").iterdir():
            path.chmod(0o644)
        staging.write_manifest(work)
        staging.install(work, staged)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return str(staged)


# --- the agent for any image: this interpreter, with everything it loads, run by its own loader
RUNTIME_DIR = "rt"  # inside the staged bundle, beside agent/
_STDLIB_LEFT_OUT = ("*.opt-1.pyc", "*.opt-2.pyc", "test", "tests", "idlelib", "tkinter",
                    "turtledemo", "lib2to3", "ensurepip", "pydoc_data", "site-packages",
                    "lib-dynload", "config-*", "distutils", "venv", "*.exe", "turtle.py")
_BUNDLE_FORMAT = 2  # part of the staged directory's name: a new layout is staged anew


def stage_bundle() -> str:
    """A world-readable directory holding ``agent/`` and ``rt/``: this interpreter, the part of
    its standard library the agent can import, every shared library they load and the dynamic
    loader itself. Run through that loader, the agent needs nothing from the image — no
    python3, no libc of the right kind (busybox, musl and distroless images alike).

    Built once per interpreter and agent version from what is running here, so a plain
    ``pip install`` gets it; it needs ``ldd`` (glibc's libc-bin), and says so if missing.
    """
    agent_dir = Path(stage_agent())
    python = Path(os.path.realpath(sys.executable))
    key = f"{_BUNDLE_FORMAT}:{python}:{sys.version}:{agent_dir.name}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    bundle = agent_dir.parent / f"bundle-{digest}"
    if staging.verified(bundle):
        return str(bundle)
    work = Path(tempfile.mkdtemp(prefix=".bundle-stage-", dir=agent_dir.parent))
    try:
        lay_out_agent(agent_dir, work)
        _build_runtime(python, work / RUNTIME_DIR)
        seal_bundle(work, sys.version)
        staging.install(work, bundle)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return str(bundle)


def lay_out_agent(agent_dir: Path, work: Path, bytecode: bool = True) -> None:
    """The agent package into a bundle being staged. Bytecode in the bundle: the mount is
    read-only, and compiling the agent and the standard library from source at every
    container start costs hundreds of ms."""
    shutil.copytree(agent_dir / "agent", work / "agent")
    if bytecode:
        compileall.compile_dir(str(work / "agent"), quiet=1)


def seal_bundle(work: Path, marker: str) -> None:
    """Mark a staged bundle complete, make it world-readable (a rootless engine's user must
    read it) and write its manifest (``staging.verified`` checks it before any reuse)."""
    (work / RUNTIME_DIR / "ready").write_text(marker)
    for path in [work, *work.rglob("*")]:
        path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    staging.write_manifest(work)


def bundle_digest(bundle: str) -> str:
    """What identifies a bundle's content: the agent's sources and the runtime's marker."""
    root = Path(bundle)
    parts = [root / RUNTIME_DIR / "ready", *sorted((root / "agent").glob("*.py"))]
    content = b"".join(p.name.encode() + p.read_bytes() for p in parts)
    return hashlib.sha256(f"{_BUNDLE_FORMAT}".encode() + content).hexdigest()[:16]


@contextlib.contextmanager
def bundle_archive(bundle: str) -> Iterator[IO[bytes]]:
    """The staged bundle as a tar (names relative, owned by root), for an engine's archive API
    when no filesystem is shared with it."""
    with tempfile.TemporaryFile(prefix="toolseam-bundle-") as archive:
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.add(bundle, arcname=".", filter=as_root)
        archive.seek(0)
        yield archive


def _build_runtime(python: Path, rt: Path) -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    # the base installation's extension modules (a venv's platstdlib has none)
    dynload = Path(sysconfig.get_config_var("DESTSHARED") or stdlib / "lib-dynload")
    libdir = rt / "lib"
    extensions = copy_interpreter(python, stdlib, dynload, rt)
    libraries, loader = _shared_closure([python, *extensions])
    for library in libraries:
        shutil.copy2(library, libdir / Path(library).name)
    shutil.copy2(loader, libdir / LOADER_NAME)


def copy_interpreter(python: Path, stdlib: Path, dynload: Path, rt: Path) -> list[Path]:
    """``rt/bin/python3`` and ``rt/lib/python3.X`` (with its extension modules), the layout the
    interpreter finds its standard library in from its own path; returns the extensions."""
    target_stdlib = rt / "lib" / stdlib.name
    (rt / "bin").mkdir(parents=True)
    shutil.copy2(python, rt / "bin" / "python3")
    # The standard library but what an agent never imports (tests, GUIs, installers, docs).
    shutil.copytree(stdlib, target_stdlib, ignore=shutil.ignore_patterns(*_STDLIB_LEFT_OUT),
                    ignore_dangling_symlinks=True)
    (target_stdlib / "lib-dynload").mkdir(exist_ok=True)
    extensions = sorted(dynload.glob("*.so"))
    for extension in extensions:
        shutil.copy2(extension, target_stdlib / "lib-dynload" / extension.name)
    return extensions


LOADER_NAME = "ld.so"  # the dynamic loader, under one name whatever its real one


def _shared_closure(binaries: list[Path]) -> tuple[set[str], str]:
    """Every shared library the binaries load (``ldd``), and the dynamic loader."""
    if shutil.which("ldd") is None:
        raise CouldNotRunError("cannot stage the sandbox agent's runtime: `ldd` is missing "
                               "(install glibc's libc-bin)", retryable=False)
    libraries: set[str] = set()
    loader = ""
    for binary in binaries:
        listing = subprocess.run(["ldd", str(binary)], capture_output=True, text=True,
                                 check=False).stdout
        for line in listing.splitlines():
            parts = line.split()
            if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
                libraries.add(parts[2])
            elif parts and parts[0].startswith("/"):
                loader = parts[0]
    if not loader:
        raise CouldNotRunError(f"cannot stage the sandbox agent's runtime: {binaries[0]} names "
                               "no dynamic loader (a static interpreter is not supported)",
                               retryable=False)
    return libraries, os.path.realpath(loader)


def bundle_command(mount: str) -> list[str]:
    """The container's first program: the bundled interpreter through the bundled loader."""
    rt = f"{mount}/{RUNTIME_DIR}"
    return [f"{rt}/lib/{LOADER_NAME}", "--library-path", f"{rt}/lib", f"{rt}/bin/python3",
            *agent_command(mount)]


class LocalAgent:
    """The host backend's agent process and its channel."""

    def __init__(self, python: str) -> None:
        self._python = python
        self.channel: AgentChannel | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._stderr_tail: deque[str] = deque(maxlen=20)
        self._stderr_task: asyncio.Task[None] | None = None

    @property
    def stderr_tail(self) -> list[str]:
        """The agent's last lines on stderr."""
        return list(self._stderr_tail)

    @property
    def launcher_pid(self) -> int | None:
        """The process this machine started (``unshare``, or the agent before it daemonised)."""
        return None if self._process is None else self._process.pid

    async def start(self, namespace: bool) -> dict[str, Any]:
        """Start the agent; returns its ``hello`` answer (raises CouldNotRunError)."""
        boot = [self._python, *agent_command(AGENT_PARENT)]
        if namespace:
            # The agent then enters a user namespace of its own, so no command can unmount
            # this /proc and look at the host's (agent/userns.py).
            user = [] if os.geteuid() == 0 else ["--user", "--map-current-user"]
            argv = ["unshare", *user, "--pid", "--fork", "--mount-proc", "--kill-child", *boot,
                    "--own-user-namespace"]
        else:
            argv = [*boot, "--daemonize"]
        # The agent is an ancestor of every command: it must carry no host secret.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        # One socketpair carries the protocol both ways (the agent's stdin and stdout): a
        # round trip over a socket is measurably cheaper than over two pipes.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *argv, stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=asyncio.subprocess.PIPE,
                env=env, close_fds=True)
        except OSError as exc:
            ours.close()
            raise CouldNotRunError(f"{argv[0]}: {exc.strerror}", retryable=False) from None
        finally:
            theirs.close()
        assert self._process.stderr
        self._stderr_task = asyncio.get_running_loop().create_task(
            self._collect_stderr(self._process.stderr))
        self.channel = await AgentChannel.over_socket(ours, "host agent")
        try:
            return await asyncio.wait_for(self.channel.call(wire.HELLO), _START_TIMEOUT_S)
        except (CouldNotRunError, TimeoutError) as exc:
            detail = " | ".join(self._stderr_tail) or str(exc)
            raise CouldNotRunError(detail, retryable=False) from None

    async def _collect_stderr(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self._stderr_tail.append(line.decode("utf-8", "replace").rstrip())

    async def stop(self) -> None:
        """Shut the agent down (it kills every job first) and reap its process."""
        channel, process, stderr_task = self.channel, self._process, self._stderr_task
        self.channel = self._process = self._stderr_task = None
        if channel is not None:
            await channel.shutdown()
        if process is not None:
            try:
                await asyncio.wait_for(process.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()  # --kill-child takes the namespace down with it
                await process.wait()
        if stderr_task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stderr_task, 5)
