"""Read scope (CONTRACT §8): reads outside the working directory ask the user, once.

In scope, never asked: the base dir; absolute and ``~`` paths the USER named in their own
messages (a file widens to that file, a directory to that directory); the OS temp dirs;
directories granted so far; system prefixes (``/usr``, ``/bin``, ``/etc`` …). Containment is
lexical or canonical: either form inside a root is enough.

A read outside asks the host's approver — ``once``, ``directory`` (this directory, or a file's
parent, for the session), ``session`` (everything, for the session) or ``deny``. Without an
approver the read is refused. Questions are asked one at a time; a read that waited behind a
question re-checks against the widened roots first, so parallel reads under one new directory
ask once. This is a policy about what a model *reads*, not a sandbox: bash can still read what
the token check cannot see (a path built at run time, a script's own opens) — containers are
the boundary.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import posixpath
import re
import shlex
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from ..seam.errors import FileOpError
from ..seam.models import PathRef
from ..seam.protocol import BuiltinExec
from .refusal import Refusal

Answer = Literal["once", "directory", "session", "deny"]
ANSWERS: tuple[Answer, ...] = ("once", "directory", "session", "deny")

SYSTEM_PREFIXES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/opt", "/dev", "/etc",
                   "/proc/self", "/sys",
                   "C:\\Windows", "C:\\Program Files", "C:\\Program Files (x86)")
_TEMP_DIRS = ("/tmp", "/var/tmp")


@dataclass(frozen=True)
class ReadQuestion:
    """What the approver is asked. ``choices`` says what each answer means."""

    tool: str
    path: str  # absolute, as the sandbox sees it
    workdir: str
    directory: str  # what a "directory" answer grants
    choices: dict[str, str] = field(default_factory=dict)


Approver = Callable[[ReadQuestion], "Answer | Awaitable[Answer]"]

# A path the user wrote: quoted (spaces kept) or bare; sentence punctuation is not part of it.
_QUOTED = re.compile(r"""(["'`])((?:~|/)[^"'`\n]*?)\1""")
_BARE = re.compile(r"""(?:(?<=^)|(?<=[\s(\[<]))((?:~(?=/|\s|$)|/)[^\s"'`]*)""")
_TRAILING = ".,;:!?)]}>"


def user_named_paths(text: str, home: str) -> set[str]:
    """Absolute and ``~`` paths named in one user message, normalised."""
    found: list[str] = [m.group(2) for m in _QUOTED.finditer(text)]
    unquoted = _QUOTED.sub(" ", text)
    found += [m.group(1).rstrip(_TRAILING) for m in _BARE.finditer(unquoted)]
    paths = set()
    for raw in found:
        if raw.startswith("~"):
            raw = home + raw[1:]
        if raw.startswith("/") and raw != "/":
            paths.add(posixpath.normpath(raw))
    return paths


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class ReadScope:
    def __init__(self, mode: str, workdir: str, approver: Approver | None,
                 backend: BuiltinExec, home: str | None = None, local: bool = True) -> None:
        self.mode = mode
        self.workdir = workdir
        self._approver = approver
        self._backend = backend
        self.home = home or os.path.expanduser("~")
        self._user_roots: set[str] = set()
        self._granted: set[str] = set()
        self._everything = False
        self._question = asyncio.Lock()
        temp = set(_TEMP_DIRS)
        if local:
            temp.add(tempfile.gettempdir())
        self._fixed_roots = (workdir, *sorted(temp))

    # --- roots --------------------------------------------------------------------------
    def add_user_message(self, text: str) -> None:
        self._user_roots |= user_named_paths(text, self.home)

    def set_user_messages(self, texts: list[str]) -> None:
        """Recompute the user-named roots from the conversation's user messages."""
        self._user_roots = set().union(*(user_named_paths(t, self.home) for t in texts))

    def _inside(self, path: str) -> bool:
        if self._everything or any(_under(path, p) for p in SYSTEM_PREFIXES):
            return True
        roots = (*self._fixed_roots, *self._user_roots, *self._granted)
        return any(_under(path, root) for root in roots)

    async def _in_scope(self, path: str) -> bool:
        if self._inside(path):
            return True
        canonical = await self._canonical(path)
        return canonical is not None and canonical != path and self._inside(canonical)

    async def _canonical(self, path: str) -> str | None:
        try:
            found = await self._backend.stat(PathRef(base="/", path=path, confine=False))
        except FileOpError:
            return None
        return found.canonical

    # --- checks -------------------------------------------------------------------------
    async def check(self, tool: str, path: str) -> None:
        """Return when ``path`` may be read; raise Refusal with the one-line text otherwise."""
        if self.mode == "unrestricted":
            return
        target = posixpath.normpath(posixpath.join(self.workdir, path))
        if await self._in_scope(target):
            return
        async with self._question:  # one question at a time per session
            if await self._in_scope(target):  # a question we waited behind may have widened it
                return
            await self._ask(tool, target)

    async def check_command(self, command: str, cwd: str) -> None:
        """The narrow bash check: an absolute path under the homes' parent, or a ``..`` climb,
        that lies outside every root asks like a read."""
        if self.mode == "unrestricted":
            return
        homes = posixpath.dirname(self.home.rstrip("/")) or "/"
        for token in _path_tokens(command):
            if token.startswith("~"):
                token = self.home + token[1:]
            if token.startswith("/"):
                target = posixpath.normpath(token)
                if not _under(target, homes):
                    continue
            elif ".." in token.split("/"):
                target = posixpath.normpath(posixpath.join(cwd, token))
            else:
                continue
            await self.check("bash", target)

    async def _ask(self, tool: str, path: str) -> None:
        refusal = (f"{tool}: {path} is outside the working directory {self.workdir} and reading "
                   "it was not approved; a host can set read_scope = \"unrestricted\" to turn "
                   "this check off")
        if self._approver is None:
            raise Refusal(refusal)
        found = await self._backend.stat(PathRef(base="/", path=path, confine=False))
        directory = path if found.kind == "dir" else posixpath.dirname(path)
        question = ReadQuestion(tool, path, self.workdir, directory, {
            "once": f"read {path} this one time",
            "directory": f"read anything under {directory} for the rest of this session",
            "session": "read anything anywhere for the rest of this session",
            "deny": "refuse this read",
        })
        answer = self._approver(question)
        if inspect.isawaitable(answer):
            answer = await answer
        if answer == "directory":
            self._granted.add(directory)
        elif answer == "session":
            self._everything = True
        elif answer != "once":
            raise Refusal(refusal)


def _path_tokens(command: str) -> list[str]:
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        words = command.split()
    tokens = []
    for word in words:
        for part in re.split(r"[=:]|(?<=[<>])", word):
            part = part.strip("<>|&;()")
            if part.startswith(("/", "~")) or ".." in part:
                tokens.append(part)
    return tokens
