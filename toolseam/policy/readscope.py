"""Read scope (CONTRACT §8): reads outside the working directory ask the user, once.

In scope, never asked: the base dir; absolute and ``~`` paths the USER named in their own
messages (a file widens to that file, a directory to that directory); the OS temp dirs;
directories granted so far; system prefixes (``/usr``, ``/bin``, ``/etc`` …) except the
secrets that live there (``SECRET_PATHS``, and anything there that is not world-readable).

Containment counts lexically or canonically (seed 003): a path written below a root is in
scope, and so is one whose canonical form — every symlink resolved, ``/proc/self/root``,
``/proc/*/cwd`` and ``/proc/*/fd/*`` included — lies below one; roots count in both their
written and their canonical form. So a symlink in the base dir to an ordinary file elsewhere is
in scope. The machine's secrets are judged on the file itself, whatever the spelling: a path
whose canonical form is a secret asks, and so does a file with more than one hard link that is
one of the secret files (the same device and inode), or that is not world-readable and lives
on the system's own filesystem — a hard link a command made in the base dir to
``/etc/shadow`` is ``/etc/shadow`` (issue 32). A hard link reaches no further: it cannot name
a directory, cross a filesystem, or outlive the file's permissions (it has the same inode and
mode), so the rest of a protected directory stays out of its reach.

A read outside asks the host's approver — ``once``, ``directory`` (this directory, or a file's
parent, for the session), ``session`` (everything, for the session) or ``deny``. Without an
approver the read is refused. Questions are asked one at a time; a read that waited behind a
question re-checks against the widened roots first, so parallel reads under one new directory
ask once. This is a policy about what a model *reads*, not a sandbox: bash can still read what
the token check cannot see (a path built at run time, a script's own opens), and a symlink
swapped between the check and the read is followed — containers are the boundary.
"""

from __future__ import annotations

import asyncio
import fnmatch
import inspect
import os
import posixpath
import re
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from ..seam.errors import FileOpError
from ..seam.models import PathRef
from ..seam.protocol import BuiltinExec
from .refusal import Refusal
from .shellwords import split_words

Answer = Literal["once", "directory", "session", "deny"]
ANSWERS: tuple[Answer, ...] = ("once", "directory", "session", "deny")

SYSTEM_PREFIXES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/opt", "/dev", "/etc",
                   "/sys", "C:\\Windows", "C:\\Program Files", "C:\\Program Files (x86)")
# Secrets under the system prefixes: asked about like any path outside (fnmatch patterns, each
# covering what lies below it). Beyond these, a system file or directory that is not
# world-readable asks too: /dev's disks and memory, keys a package made 0600.
SECRET_PATHS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-",
                "/etc/security/opasswd", "/etc/sudoers", "/etc/sudoers.d", "/etc/ssh/ssh_host_*key",
                "/etc/ssl/private", "/etc/pki/*/private", "/etc/*.keytab", "/etc/letsencrypt",
                "/etc/NetworkManager/system-connections", "/etc/wireguard", "/etc/ipsec.secrets",
                "/etc/ppp/*-secrets", "/etc/mysql/debian.cnf", "/etc/docker/key.json",
                "/etc/containers/auth.json", "/dev/mem", "/dev/kmem", "/dev/port")
_CONTENT_TOOLS = ("read", "grep", "edit", "apply_patch", "bash")  # glob lists names only
# The secret files a hard link is compared with by identity (SECRET_PATHS' files, its globs
# spelt out); any other multi-link file that is not world-readable on /etc's device asks too.
_SECRET_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-",
                 "/etc/security/opasswd", "/etc/sudoers", "/etc/ipsec.secrets",
                 "/etc/mysql/debian.cnf", "/etc/docker/key.json", "/etc/containers/auth.json",
                 *(f"/etc/ssh/ssh_host_{k}_key" for k in ("rsa", "dsa", "ecdsa", "ed25519")))
# Bash tokens: a /proc path into a process's root or cwd names the file below it. Resolving it
# here would ask the wrong process (this one, or the agent — not the command), so it is
# rewritten: /proc/*/root/X is /X, /proc/self/cwd/X is X from the command's cwd. Other /proc
# paths and the command's own streams (/dev/stdout, /dev/fd/N …) are the command's own business.
_OWN_STREAMS = re.compile(r"^/(?:dev/(?:std(?:in|out|err)|fd|tty\w*|pts)|proc)(?:/|$)")
_TEMP_DIRS = ("/tmp", "/var/tmp")
_PROBES_AT_ONCE = 64  # stats in flight at once when a search's hits are judged file by file


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


def is_secret_system_path(path: str) -> bool:
    """One of ``SECRET_PATHS``, or below one."""
    return any(fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern + "/*")
               for pattern in SECRET_PATHS)


def _holds_secrets(directory: str) -> bool:
    """A directory a recursive search would read a ``SECRET_PATHS`` entry through."""
    return any(_under(re.split(r"[*?\[]", pattern)[0].rsplit("/", 1)[0] or "/", directory)
               for pattern in SECRET_PATHS)


@dataclass(frozen=True)
class _Probe:
    """What the sandbox says is at a path: its canonical form and, when it exists, kind/mode."""

    canonical: str
    kind: str = "missing"
    mode: int = 0
    links: int = 1
    inode: str = ""


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
        self._canonical_roots: dict[str, str] = {}  # a root as written -> its canonical form
        self._secret_inodes: set[str] | None = None  # the secret files' identities, at first need
        self._system_device = ""
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

    async def _roots(self) -> list[str]:
        """Every root as written and canonical (a root reached through a symlink, say a base
        dir under a linked /tmp, still holds what lies below its real directory)."""
        written = (*self._fixed_roots, *self._user_roots, *self._granted)
        for root in written:
            if root not in self._canonical_roots:
                probe = await self._probe(root)
                self._canonical_roots[root] = root if probe is None else probe.canonical
        return [*written, *(self._canonical_roots[root] for root in written)]

    async def _probe(self, path: str) -> _Probe | None:
        try:
            found = await self._backend.stat(PathRef(base="/", path=path, confine=False))
        except FileOpError:
            return None
        return _Probe(found.canonical, found.kind, found.mode, found.links, found.inode)

    async def _verdict(self, tool: str, target: str) -> tuple[bool, _Probe | None]:
        """Whether ``target`` (absolute, normalised) is in scope: written or leading below a
        root, unless the file itself is one of the machine's secrets."""
        probe = await self._probe(target)
        path = target if probe is None else probe.canonical
        if self._everything:
            return True, probe
        roots = await self._roots()
        if any(_under(path, root) for root in roots):  # leads below a root (a granted one too)
            return not await self._linked_secret(tool, probe), probe
        system = any(_under(path, prefix) for prefix in SYSTEM_PREFIXES)
        if (system and self._secret(tool, path, probe)) or await self._linked_secret(tool, probe):
            return False, probe
        return system or any(_under(target, root) for root in roots), probe

    async def _linked_secret(self, tool: str, probe: _Probe | None) -> bool:
        """A file with more than one hard link that is a secret file itself (its identity), or
        is not world-readable on the system's own filesystem (where a link to one would be)."""
        if tool not in _CONTENT_TOOLS or probe is None or probe.kind != "file" or \
                probe.links < 2 or not probe.inode:
            return False
        if self._secret_inodes is None:
            found = [await self._probe(path) for path in _SECRET_FILES]
            self._secret_inodes = {p.inode for p in found if p is not None and p.inode
                                   and p.kind == "file"}
            system = await self._probe("/etc")
            self._system_device = system.inode.split(":")[0] if system and system.inode else ""
        if probe.inode in self._secret_inodes:
            return True
        return not probe.mode & 0o004 and probe.inode.split(":")[0] == self._system_device

    @staticmethod
    def _secret(tool: str, path: str, probe: _Probe | None) -> bool:
        """A system path whose content is a secret of the machine."""
        if tool not in _CONTENT_TOOLS:
            return False
        if is_secret_system_path(path):
            return True
        if probe is not None and probe.kind == "dir" and tool == "grep" and _holds_secrets(path):
            return True  # a recursive search of /etc would read /etc/shadow
        world = 0o005 if probe is not None and probe.kind == "dir" else 0o004
        return probe is not None and probe.kind != "missing" and probe.mode & world != world

    # --- checks -------------------------------------------------------------------------
    async def check(self, tool: str, path: str) -> None:
        """Return when ``path`` may be read; raise Refusal with the one-line text otherwise."""
        if self.mode == "unrestricted":
            return
        target = posixpath.normpath(posixpath.join(self.workdir, path))
        if (await self._verdict(tool, target))[0]:
            return
        async with self._question:  # one question at a time per session
            inside, probe = await self._verdict(tool, target)  # an earlier answer may widen it
            if not inside:
                await self._ask(tool, target, probe)

    async def hidden_in_search(self, tool: str, root: str, rels: set[str]) -> dict[str, str]:
        """Of the files a search below ``root`` (checked already) found, those it may not show,
        each with why. A search reads every file below its root in the sandbox, so each file
        it shows is judged again on its own: one that is a secret whatever its name (another
        hard link to one) asks like a read; one the check cannot see at all is left out —
        on the host backend the search runs in the agent's mount namespace, where a command
        can bind-mount /etc into the base dir (issue 32)."""
        if self.mode == "unrestricted" or self._everything:
            return {}
        base = posixpath.normpath(posixpath.join(self.workdir, root))
        top = await self._probe(base)
        if top is None or top.kind != "dir":
            return {}  # a single file: checked as the search's root
        hidden = {}
        ordered = sorted(rels)
        targets = [posixpath.normpath(posixpath.join(base, rel)) for rel in ordered]
        probes: list[_Probe | None] = []
        for start in range(0, len(targets), _PROBES_AT_ONCE):  # a round trip each in a container:
            probes += await asyncio.gather(  # at once, not one after the other
                *(self._probe(t) for t in targets[start:start + _PROBES_AT_ONCE]))
        for rel, target, probe in zip(ordered, targets, probes, strict=True):
            if probe is None or probe.kind != "file":
                hidden[rel] = "not visible to the read scope's check (a mount only the " \
                              "sandbox's commands see?)"
                continue
            system = any(_under(probe.canonical, p) for p in SYSTEM_PREFIXES)
            if (system and self._secret(tool, probe.canonical, probe)) or \
                    await self._linked_secret(tool, probe):
                try:
                    await self.check(tool, target)
                except Refusal as refusal:
                    hidden[rel] = str(refusal)
        return hidden

    async def check_command(self, command: str, cwd: str) -> None:
        """The narrow bash check: an absolute path under the homes' parent or a known system
        secret (``/proc/*/root/`` and ``/proc/self/cwd/`` spellings of them included), or a
        ``..`` climb — that lies outside every root — asks like a read."""
        if self.mode == "unrestricted":
            return
        homes = posixpath.dirname(self.home.rstrip("/")) or "/"
        for token in _path_tokens(command):
            if token.startswith("~"):
                token = self.home + token[1:]
            if token.startswith("/"):
                target = _without_proc_links(token, cwd)
                if _OWN_STREAMS.match(target) or not (
                        _under(target, homes) or is_secret_system_path(target)):
                    continue
            elif ".." in token.split("/"):
                target = posixpath.normpath(posixpath.join(cwd, token))
            else:
                continue
            await self.check("bash", target)

    async def _ask(self, tool: str, path: str, probe: _Probe | None) -> None:
        where = path if probe is None else probe.canonical
        shown = path if where == path else f"{path} (which is {where})"
        if any(_under(where, prefix) for prefix in SYSTEM_PREFIXES):
            what = f"{shown} holds secrets of this system"
        elif probe is not None and probe.links > 1 and await self._linked_secret(tool, probe):
            what = (f"{shown} is a hard link ({probe.links} names) to a file that may hold "
                    "secrets of this system")
        else:
            what = f"{shown} is outside the working directory {self.workdir}"
        refusal = (f"{tool}: {what} and reading it was not approved; a host can set read_scope = "
                   "\"unrestricted\" to turn this check off")
        if self._approver is None:
            raise Refusal(refusal)
        directory = where if probe is not None and probe.kind == "dir" else posixpath.dirname(where)
        question = ReadQuestion(tool, path, self.workdir, directory, {
            "once": f"read {shown} this one time",
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


def _without_proc_links(token: str, cwd: str) -> str:
    """An absolute bash token resolved lexically the way the kernel would treat its ``/proc``
    links: ``/proc/<pid>/root`` (or ``…/task/<tid>/root``) is ``/``, ``/proc/self/cwd`` is the
    command's cwd, and a ``..`` after one of them climbs from there (``normpath`` would climb back
    into ``/proc`` instead). Doubled slashes are taken out (``normpath`` keeps two leading ones).
    """
    resolved: list[str] = []
    for comp in token.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if resolved:
                resolved.pop()
            continue
        resolved.append(comp)
        if resolved[0] != "proc" or len(resolved) not in (3, 5) or comp not in ("root", "cwd"):
            continue
        if len(resolved) == 5 and resolved[2] != "task":
            continue
        if comp == "root":
            resolved = []
        elif resolved[1] in ("self", "thread-self"):
            resolved = [c for c in cwd.split("/") if c]
    return "/" + "/".join(resolved)


def _path_tokens(command: str) -> list[str]:
    try:
        words = split_words(command)  # shlex.split's words, in linear time (shellwords.py)
    except ValueError:
        words = command.split()
    tokens = []
    for word in words:
        for part in re.split(r"[=:]|(?<=[<>])", word):
            part = part.strip("<>|&;()")
            if part.startswith(("/", "~")) or ".." in part:
                tokens.append(part)
    return tokens
