"""The agent bundle for another CPU architecture, assembled from Debian's packages of it.

``stage_bundle`` copies the interpreter that is running; an engine whose machine has another
CPU (an arm64 builder driven from an amd64 host) needs that interpreter built for its CPU.
Debian publishes it: this module downloads the packages of ``python3.11`` and the libraries
the standard library's extension modules load for the wanted architecture
(``apt-get download pkg:ARCH`` — the architecture added with ``dpkg --add-architecture``),
unpacks them into a sysroot and lays the bundle out exactly as ``stage_bundle`` does: the same
agent, the same ``bundle_command``. Bytecode is arch-independent, so it is compiled here.

    python -m toolseam.backends.containers.bundle.foreign_arch arm64 /srv/toolseam-agent-arm64

then ``PodmanBackend(..., agent_bundles={"arm64": "/srv/toolseam-agent-arm64"})`` (or
``TOOLSEAM_AGENT_BUNDLE_ARM64``). Written by hand: no packaging tool assembles a relocatable
interpreter from distribution packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ....seam.errors import ConfigurationError, CouldNotRunError
from ...agentlink.launch import stage_agent
from .staged import (
    LOADER_NAME,
    RUNTIME_DIR,
    copy_interpreter,
    lay_out_agent,
    seal_bundle,
)

# Debian architecture -> (multiarch triplet, the dynamic loader's name)
ARCHES = {"amd64": ("x86_64-linux-gnu", "ld-linux-x86-64.so.2"),
          "arm64": ("aarch64-linux-gnu", "ld-linux-aarch64.so.1")}
# The names engines report (docker: uname -m; podman: Go's GOARCH) -> Debian's
ENGINE_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
PYTHON = "3.11"
# python3.11's own packages and every library they depend on (`apt-cache depends`), plus
# libtirpc3's Kerberos libraries, which its extension modules load through libnsl2
PACKAGES = (f"python{PYTHON}-minimal", f"libpython{PYTHON}-minimal", f"libpython{PYTHON}-stdlib",
            "libc6", "zlib1g", "libexpat1", "libffi8", "libssl3", "libbz2-1.0", "liblzma5",
            "libsqlite3-0", "libuuid1", "libncursesw6", "libtinfo6", "libreadline8", "libdb5.3",
            "libcrypt1", "libnsl2", "libtirpc3", "libgssapi-krb5-2", "libkrb5-3", "libk5crypto3",
            "libkrb5support0", "libcom-err2", "libkeyutils1")


def host_arch() -> str:
    return ENGINE_ARCH.get(os.uname().machine, os.uname().machine)


def fetch_sysroot(arch: str, sysroot: Path) -> None:
    """Download and unpack the packages for ``arch`` (apt must know the architecture)."""
    with tempfile.TemporaryDirectory(prefix="toolseam-debs-") as work:
        wanted = [f"{package}:{arch}" for package in PACKAGES]
        done = subprocess.run(["apt-get", "download", "-q", *wanted], cwd=work,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ConfigurationError(
                f"apt-get download for {arch} failed (run `dpkg --add-architecture {arch} && "
                f"apt-get update` first): {done.stderr.strip()[-400:]}")
        for deb in sorted(Path(work).glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(sysroot)], check=True)


def build(arch: str, sysroot: Path, out: Path) -> Path:
    """Lay the bundle for ``arch`` out in ``out`` from an unpacked sysroot."""
    if arch not in ARCHES:
        raise ConfigurationError(f"architecture {arch!r}: known are {', '.join(ARCHES)}")
    triplet, loader = ARCHES[arch]
    stdlib = sysroot / "usr" / "lib" / f"python{PYTHON}"
    python = sysroot / "usr" / "bin" / f"python{PYTHON}"
    if not python.exists():
        raise ConfigurationError(f"no python{PYTHON} for {arch} in {sysroot}")
    work = Path(tempfile.mkdtemp(prefix="toolseam-bundle-arch-", dir=out.parent))
    try:
        # bytecode is the same on every CPU, but only this interpreter's version writes it
        same_version = sys.version_info[:2] == tuple(int(p) for p in PYTHON.split("."))
        lay_out_agent(Path(stage_agent()), work, bytecode=same_version)
        rt = work / RUNTIME_DIR
        copy_interpreter(python, stdlib, stdlib / "lib-dynload", rt)
        for libdir in (sysroot / "lib" / triplet, sysroot / "usr" / "lib" / triplet):
            for library in sorted(libdir.glob("*.so*")) if libdir.is_dir() else []:
                real = _in_sysroot(sysroot, library)
                if real.is_file():  # a symlink's file, under the link's name
                    shutil.copy2(real, rt / "lib" / library.name)
        loaders = [_in_sysroot(sysroot, sysroot / d / triplet / loader) for d in ("usr/lib", "lib")]
        found = [path for path in loaders if path.is_file()]
        if not found:
            raise ConfigurationError(f"no dynamic loader {loader} in {sysroot}")
        shutil.copy2(found[0], rt / "lib" / LOADER_NAME)
        seal_bundle(work, f"{arch} python{PYTHON}")
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out


def select_bundle(engine_arch: str, local_bundle: str, configured: dict[str, str]) -> str:
    """The bundle for an engine whose machine reports ``engine_arch``: this machine's own
    when the CPU is the same, else one configured for that architecture (an option, or
    ``TOOLSEAM_AGENT_BUNDLE_<ARCH>``) — or a could-not-run saying how to build it."""
    arch = ENGINE_ARCH.get(engine_arch, engine_arch)
    if arch == host_arch():
        return local_bundle
    path = configured.get(arch) or os.environ.get(f"TOOLSEAM_AGENT_BUNDLE_{arch.upper()}")
    if path:
        if not (Path(path) / RUNTIME_DIR / "ready").exists():
            raise CouldNotRunError(f"the agent bundle for {arch} at {path} is incomplete "
                                   f"(no {RUNTIME_DIR}/ready)", retryable=False)
        return path
    raise CouldNotRunError(
        f"the engine runs {arch} and this machine is {host_arch()}: build the agent for it with "
        f"`python -m toolseam.backends.containers.bundle.foreign_arch {arch} DIR` and pass agent_bundles="
        f"{{'{arch}': DIR}} (or set TOOLSEAM_AGENT_BUNDLE_{arch.upper()})", retryable=False)


def _in_sysroot(sysroot: Path, path: Path) -> Path:
    """Follow symlinks as the target system would: an absolute target is below the sysroot,
    never this machine's own file."""
    for _ in range(40):
        if not path.is_symlink():
            return path
        target = os.readlink(path)
        path = sysroot / target.lstrip("/") if target.startswith("/") else path.parent / target
    raise ConfigurationError(f"symlink loop at {path}")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit("usage: python -m toolseam.backends.containers.bundle.foreign_arch ARCH OUT-DIR")
    arch, out = args[0], Path(args[1]).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="toolseam-sysroot-") as sysroot:
        fetch_sysroot(arch, Path(sysroot))
        print(build(arch, Path(sysroot), out))


if __name__ == "__main__":
    main()
