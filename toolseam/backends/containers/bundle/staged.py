"""The container runtime bundle: the staged agent (``agentlink/launch.py``) beside this
interpreter and everything it loads, so the agent runs in any image as its first program.

* ``stage_bundle`` — the bundle for this machine's CPU, staged where only this user can change
  it (``staging.py``); ``foreign_arch.py`` builds one for another CPU from its packages;
* ``bundle_command`` — the container's first program: the bundled loader, interpreter, agent;
* ``bundle_archive`` / ``bundle_digest`` — the bundle for an engine's archive API, and what
  identifies its content.
"""

from __future__ import annotations

import compileall
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ....seam.errors import CouldNotRunError
from ... import staging
from ...agentlink.launch import AGENT_PACKAGE, agent_command, stage_agent
from ..workspace_sync.policy import as_root

# --- the agent for any image: this interpreter, with everything it loads, run by its own loader
RUNTIME_DIR = "rt"  # inside the staged bundle, beside toolseam_agent/
_STDLIB_LEFT_OUT = ("*.opt-1.pyc", "*.opt-2.pyc", "test", "tests", "idlelib", "tkinter",
                    "turtledemo", "lib2to3", "ensurepip", "pydoc_data", "site-packages",
                    "lib-dynload", "config-*", "distutils", "venv", "*.exe", "turtle.py")
_BUNDLE_FORMAT = 3  # part of the staged directory's name: a new layout is staged anew


# Sessions opening together in one process stage (or verify: a hash of ~78 MB) once, not
# once each: the first does it, the others wait and find it verified (decision 113).
_STAGING = threading.Lock()


def stage_bundle() -> str:
    """One staging at a time in this process (``_stage_bundle``)."""
    with _STAGING:
        return _stage_bundle()


def _stage_bundle() -> str:
    """A world-readable directory holding ``__main__.py``, ``toolseam_agent/`` and ``rt/``: this
    interpreter, the part of its standard library the agent can import, every shared library
    they load and the dynamic loader itself. Run through that loader, the agent needs nothing
    from the image — no python3, no libc of the right kind (busybox, musl and distroless images alike).

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
    shutil.copytree(agent_dir / AGENT_PACKAGE, work / AGENT_PACKAGE,
                    ignore=None if bytecode else shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(agent_dir / "__main__.py", work / "__main__.py")
    if bytecode:
        compileall.compile_dir(str(work / AGENT_PACKAGE), quiet=1)


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
    parts = [root / RUNTIME_DIR / "ready", root / "__main__.py",
             *sorted((root / AGENT_PACKAGE).glob("*.py"))]
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
