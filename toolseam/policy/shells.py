"""Which interpreter ``bash`` runs: a verbatim argv prefix, a catalog id, or detection.

The catalog has stable ids per platform (``bash``, ``sh`` on POSIX; ``cmd``,
``windows-powershell``, ``git-bash`` on Windows). Existence is asked of the backend, so a
container backend resolves the shell inside its image, not on the host. A host may pin the
resolution for a turn; a spawn whose fresh resolution differs from the pin fails with
``COMMAND_SHELL_CHANGED`` instead of silently switching interpreters.
"""

from __future__ import annotations

import ntpath
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from ..seam.errors import ShellChangedError, ShellNotFound, UnknownShellError

Platform = Literal["posix", "windows"]
Exists = Callable[[str], Awaitable[bool]]  # is there an executable file at this absolute path?


@dataclass(frozen=True)
class ShellSpec:
    id: str
    platform: Platform
    dialect: str
    programs: tuple[str, ...]  # absolute paths or bare names looked up on PATH, in order
    args: tuple[str, ...]


def _windows_programs(env: Mapping[str, str], *names: str) -> tuple[str, ...]:
    return tuple(n for n in names if n)


def catalog(env: Mapping[str, str]) -> dict[str, ShellSpec]:
    """The shell catalog; Windows entries depend on the environment (COMSPEC, ProgramFiles)."""
    system_root = env.get("SystemRoot", r"C:\Windows")
    program_files = env.get("ProgramFiles", r"C:\Program Files")
    return {
        "bash": ShellSpec("bash", "posix", "bash", ("/bin/bash", "/usr/bin/bash"), ("-c",)),
        "sh": ShellSpec("sh", "posix", "posix-sh", ("/bin/sh", "/usr/bin/sh"), ("-c",)),
        "cmd": ShellSpec("cmd", "windows", "cmd", _windows_programs(
            env, env.get("COMSPEC", ""), ntpath.join(system_root, "System32", "cmd.exe")),
            ("/d", "/s", "/c")),
        "windows-powershell": ShellSpec("windows-powershell", "windows", "powershell", (
            ntpath.join(system_root, "System32", "WindowsPowerShell", "v1.0", "powershell.exe"),
            "powershell.exe"), ("-NoProfile", "-Command")),
        "git-bash": ShellSpec("git-bash", "windows", "bash", (
            ntpath.join(program_files, "Git", "bin", "bash.exe"), "bash.exe"), ("-lc",)),
    }


# Detection when the host names nothing (ADR 0034 D1): POSIX means sh; Windows tries
# %COMSPEC% first, then pwsh, then Windows PowerShell, then a bash.
_DETECT_POSIX = (("/bin/sh", "-c"), ("/usr/bin/sh", "-c"))


def _detect_windows(env: Mapping[str, str]) -> tuple[tuple[str, ...], ...]:
    comspec = env.get("COMSPEC")
    return tuple(c for c in (
        (comspec, "/d", "/s", "/c") if comspec else None,
        ("pwsh.exe", "-NoProfile", "-Command"),
        ("powershell.exe", "-NoProfile", "-Command"),
        ("bash.exe", "-lc"),
    ) if c is not None)


@dataclass(frozen=True)
class ShellChoice:
    """The resolved interpreter, reported in every bash result's metadata."""

    argv: tuple[str, ...]
    id: str | None  # None for a verbatim prefix or detection
    fallback: bool = False  # a persisted id was unavailable; the first available one was taken

    @property
    def label(self) -> str:
        return " ".join(self.argv)


class ShellResolver:
    def __init__(self, platform: Platform, exists: Exists, env: Mapping[str, str]) -> None:
        self.platform = platform
        self._exists = exists
        self._env = env
        self.catalog = catalog(env)

    async def _locate(self, program: str) -> str | None:
        absolute = program.startswith("/") or ntpath.isabs(program)
        if absolute:
            return program if await self._exists(program) else None
        sep, join = (";", ntpath.join) if self.platform == "windows" else (":", lambda a, b: f"{a}/{b}")
        for directory in self._env.get("PATH", "").split(sep):
            if directory and await self._exists(join(directory, program)):
                return join(directory, program)
        return None

    async def _argv_for(self, spec: ShellSpec) -> tuple[str, ...] | None:
        for program in spec.programs:
            found = await self._locate(program)
            if found is not None:
                return (found, *spec.args)
        return None

    async def available(self) -> list[str]:
        """Catalog ids of this platform whose interpreter exists here, in catalog order."""
        return [sid for sid, spec in self.catalog.items()
                if spec.platform == self.platform and await self._argv_for(spec) is not None]

    async def resolve(self, shell: list[str] | None = None, shell_id: str | None = None,
                      persisted: bool = False) -> ShellChoice:
        """Resolve once; raises ShellNotFound / UnknownShellError (host errors)."""
        if shell is not None:
            return ShellChoice(tuple(shell), None)
        if shell_id is not None:
            return await self._by_id(shell_id, persisted)
        candidates = _DETECT_POSIX if self.platform == "posix" else _detect_windows(self._env)
        for program, *args in candidates:
            found = await self._locate(program)
            if found is not None:
                return ShellChoice((found, *args), None)
        tried = ", ".join(c[0] for c in candidates)
        raise ShellNotFound(f"no shell found (tried: {tried}); set a shell, or disable bash")

    async def _by_id(self, shell_id: str, persisted: bool) -> ShellChoice:
        spec = self.catalog.get(shell_id)
        if spec is None:
            known = ", ".join(self.catalog)
            raise UnknownShellError(f"unknown shell id {shell_id!r}; known ids: {known}")
        if spec.platform != self.platform:
            raise UnknownShellError(
                f"shell id {shell_id!r} is a {spec.platform} shell; this sandbox is {self.platform}")
        argv = await self._argv_for(spec)
        if argv is not None:
            return ShellChoice(argv, shell_id)
        if not persisted:
            raise UnknownShellError(f"shell {shell_id!r} is not available here")
        for other in await self.available():
            other_argv = await self._argv_for(self.catalog[other])
            assert other_argv is not None
            return ShellChoice(other_argv, other, fallback=True)
        raise ShellNotFound(f"shell {shell_id!r} is unavailable and no other shell of the "
                            f"{self.platform} catalog is available")


def check_pin(pinned: ShellChoice, fresh: ShellChoice) -> None:
    """Refuse a spawn whose shell resolution moved since the turn pinned it."""
    if (pinned.id, pinned.argv) != (fresh.id, fresh.argv):
        raise ShellChangedError(
            f"the shell changed since the turn pinned it: {pinned.label!r} -> {fresh.label!r}")
