"""The host mounts behind a pool's bind mode (``pool.py``; docs/pool.md, decision 110).

A pool directory is bind-mounted onto itself and made a *shared* mount; each pre-warmed
container gets one slot below it, bind-mounted at ``/workspace`` with *slave* propagation. At
hand-out the base dir is bind-mounted onto the slot on the host and appears in the running
container at once — one ``mount(2)``, no copy, no restart. Only a process that may mount
(root, in the engine's mount namespace) can do this; elsewhere the pool copies.

Mounts outlive a process killed with ``-9``: each pool directory holds its owner's label, and
``sweep_dead_pools`` unmounts and removes those whose owner is gone (the janitor calls it).
Pool directories live in this user's own ``pools`` directory (``staging.user_dir``), never the
shared temp dir, and the sweep trusts nothing it finds there either: it takes only real
directories of this user's that no one else may write, reads the owner file through a
descriptor without following links, and detaches only mounts at or below the directory as
found (issue 32: a planted link once steered root's janitor into unmounting ``/dev/shm``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

from ...mount_calls import MNT_DETACH, libc, mount, mount_table, unmount
from ...staging import own_entries, read_own_file, user_dir
from ..labels import owner_is_gone, owner_label

MS_BIND = 0x1000
MS_REC = 0x4000
MS_SHARED = 0x100000
_PREFIX = "toolseam-pool-"
_OWNER_FILE = "owner"
_NAMESPACE_FILE = "mountns"  # the pid whose mount namespace holds the slots' mounts
_CAP_SYS_ADMIN = 21

_log = logging.getLogger(__name__)


def can_mount() -> bool:
    """Whether this process may make bind mounts (root with CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        return False
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            caps = next(line for line in status if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caps.split()[1], 16) >> _CAP_SYS_ADMIN & 1)


class HostSlots:
    """Mounts in this process's mount namespace, by ``mount(2)``: a rootful engine on this
    machine creates its containers in it."""

    def share(self, directory: str) -> None:
        mount(directory, directory, MS_BIND)
        mount(None, directory, MS_SHARED)

    def bind(self, source: str, slot: str) -> None:
        mount(source, slot, MS_BIND | MS_REC)

    def unmount_below(self, path: str) -> None:
        for target in sorted(_mounts_below(path, "/proc/self/mountinfo"), key=len, reverse=True):
            unmount(target)


class NamespaceSlots:
    """Mounts inside another process's mount namespace: rootless podman creates its containers
    in a user and mount namespace of its own (its pause process's), which a host mount never
    reaches. Entering it takes root here (decision 114).

    That namespace's mounts are its unprivileged owner's to arrange, so root must never run
    anything found through it: the mounts are made by a forked child of this process that
    calls ``setns`` and ``mount`` through the libc already loaded — no binary, library or
    module is loaded after the switch (``nsenter mount …`` would run the owner's ``mount``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def share(self, directory: str) -> None:
        # MS_REC although the directory is new: in a namespace an unprivileged user owns, a
        # non-recursive bind is refused (EINVAL) when the kernel finds a locked mount below
        # the source — and mounts propagated in from the host are locked there. CI saw it
        # twice in a full suite (rootful pools mount beside rootless ones); never here alone.
        self._in_namespace([(directory, directory, MS_BIND | MS_REC),
                            (None, directory, MS_SHARED)])

    def bind(self, source: str, slot: str) -> None:
        self._in_namespace([(source, slot, MS_BIND | MS_REC)])

    def unmount_below(self, path: str) -> None:
        targets = sorted(_mounts_below(path, f"/proc/{self.pid}/mountinfo"), key=len,
                         reverse=True)
        if targets:
            self._in_namespace([(None, target, _UNMOUNT) for target in targets])

    def _in_namespace(self, steps: list[tuple[str | None, str, int]]) -> None:
        encoded = [(None if src is None else src.encode(), dst.encode(), flags)
                   for src, dst, flags in steps]
        namespace = os.open(f"/proc/{self.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        said_r, said_w = os.pipe2(os.O_CLOEXEC)  # which step failed: the exit code is its errno
        try:
            with warnings.catch_warnings():  # 3.12+ warns about fork in a threaded process:
                warnings.simplefilter("ignore", DeprecationWarning)  # the child execs nothing
                child = os.fork()
            if child == 0:  # pragma: no cover - the child; only libc calls, then _exit
                code = 1
                try:
                    code = _child_steps(namespace, encoded, said_w)
                finally:
                    os._exit(code)
        finally:
            os.close(namespace)
            os.close(said_w)
        code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        with os.fdopen(said_r, "rb") as said:
            failed_step = said.read(64).decode("ascii", "replace")
        if code == errno.EINVAL and failed_step == "setns":
            # Full suites saw a forked child's setns refused with EINVAL, then every later one
            # in that process too (decision 389): what of the parent a fork carries over is
            # the suspect. A fresh interpreter carries nothing over; it is started (and loads
            # all it needs) before it joins the namespace, so nothing there is run.
            code, failed_step = _in_fresh_process(self.pid, steps)
        if code:
            where = ", ".join(dst for _, dst, _ in steps)
            raise OSError(code, f"mount on {where} in the mount namespace of process "
                                f"{self.pid}: {os.strerror(code) if code > 0 else code} "
                                f"(at {failed_step or 'an unknown step'})")


_FRESH_STEPS = r"""
import ctypes, ctypes.util, json, os, sys
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
pid, steps = int(sys.argv[1]), json.loads(sys.argv[2])
fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
if libc.setns(fd, 0x00020000):
    print("setns (a fresh process)", end="")
    sys.exit(ctypes.get_errno() & 0xFF or 1)
for number, (source, target, flags) in enumerate(steps, 1):
    source = None if source is None else source.encode()
    if flags == -1:
        failed = libc.umount2(target.encode(), 2)
    else:
        failed = libc.mount(source, target.encode(), None, flags, None)
    if failed:
        err = ctypes.get_errno()
        if flags == -1 and err in (22, 2):
            continue
        print(f"step {number} of {len(steps)} (flags {flags:#x}, a fresh process)", end="")
        sys.exit(err & 0xFF or 1)
"""


def _in_fresh_process(pid: int, steps: list[tuple[str | None, str, int]]) -> tuple[int, str]:
    """The steps by a new interpreter of this one's (``-I -S``: no site, no environment),
    which opens the namespace and joins it itself; its exit code and the step it names."""
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _FRESH_STEPS, str(pid),
                           json.dumps(steps)], capture_output=True, text=True, check=False,
                          timeout=60)
    return done.returncode, done.stdout or done.stderr[-200:]


_UNMOUNT = -1  # a step that detaches its target instead of mounting
_CLONE_NEWNS = 0x00020000
_setns, _mount_call, _umount2 = libc.setns, libc.mount, libc.umount2  # resolved before forks


def _child_steps(namespace: int, steps: list[tuple[bytes | None, bytes, int]],
                 said: int) -> int:
    """In a forked child: join the namespace, run the steps; the exit code is the errno of
    the first that failed (0: all done), and ``said`` names that step."""
    if _setns(namespace, _CLONE_NEWNS):
        os.write(said, b"setns")
        return ctypes.get_errno() & 0xFF or 1
    for number, (source, target, flags) in enumerate(steps, 1):
        failed = _umount2(target, MNT_DETACH) if flags == _UNMOUNT else \
            _mount_call(source, target, None, flags, None)
        if failed:
            err = ctypes.get_errno()
            if flags == _UNMOUNT and err in (errno.EINVAL, errno.ENOENT):
                continue
            os.write(said, b"step %d of %d (flags %#x)" % (number, len(steps), flags))
            return err & 0xFF or 1
    return 0


SlotMounts = HostSlots | NamespaceSlots
HOST_SLOTS = HostSlots()


def rootless_namespace(socket_path: str) -> int | None:
    """The pid of the process whose mount namespace a rootless podman API service creates its
    containers in (its pause process: ``$XDG_RUNTIME_DIR/libpod/tmp/pause.pid``, the runtime
    dir being where the service's socket lives), or None."""
    runtime = os.path.dirname(os.path.dirname(socket_path))
    try:
        with open(os.path.join(runtime, "libpod", "tmp", "pause.pid"), encoding="ascii") as f:
            pid = int(f.read().strip())
        os.stat(f"/proc/{pid}/ns/mnt")
    except (OSError, ValueError):
        return None
    return pid


def make_pool_dir(slots: SlotMounts | None) -> str:
    """A fresh pool directory owned by this process (its label inside). With ``slots`` (bind
    mode) it is made a shared mount where the containers are created."""
    path = tempfile.mkdtemp(prefix=_PREFIX, dir=user_dir("pools"))
    with open(os.path.join(path, _OWNER_FILE), "w", encoding="utf-8") as owner:
        owner.write(owner_label())
    if slots is None:
        return path
    os.chmod(path, 0o711)  # a rootless engine's user passes through to the slots
    if isinstance(slots, NamespaceSlots):
        with open(os.path.join(path, _NAMESPACE_FILE), "w", encoding="ascii") as ns:
            ns.write(str(slots.pid))
    try:
        _share(slots, path)
    except OSError:
        remove_pool_dir(path)
        raise
    return path


def _share(slots: SlotMounts, path: str) -> None:
    """``slots.share(path)``; in rootless podman's namespace, once more after an EINVAL.

    A full suite saw EINVAL there about once in 200 pools (two steps: the bind, then making it
    shared) and never alone (200 concurrent pools, every pooled contract class). What undoes
    the fresh mount is not found yet (docs/testing.md); the second try starts from nothing,
    and what the first failed with is logged, never hidden."""
    try:
        slots.share(path)
    except OSError as first:
        if not isinstance(slots, NamespaceSlots) or first.errno != errno.EINVAL:
            raise
        _log.warning("pool directory %s: %s; trying once more", path, first)
        slots.unmount_below(path)
        slots.share(path)


def make_slot(pool_dir: str, name: str) -> str:
    """A slot directory for one sandbox; a marker inside tells an unmounted slot apart. Both
    readable by all: a rootless container starts in it (its working directory)."""
    slot = os.path.join(pool_dir, name)
    os.mkdir(slot)
    os.chmod(slot, 0o755)
    with open(os.path.join(slot, slot_marker(name)), "w", encoding="ascii"):
        pass
    return slot


def slot_marker(name: str) -> str:
    """A file only the empty slot holds: if a sandbox still sees it after the base dir was
    mounted, the mount did not reach the container's mount namespace."""
    return f".toolseam-empty-slot-{name}"


def release_slot(slots: SlotMounts, slot: str) -> None:
    """Unmount the base dir from a slot (the container sees it go) and remove the slot."""
    slots.unmount_below(slot)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(slot, slot_marker(os.path.basename(slot))))
    with contextlib.suppress(OSError):
        os.rmdir(slot)


def remove_pool_dir(path: str) -> None:
    """Unmount everything at and below a pool directory, deepest first, where it was mounted
    (here, or in the namespace its file names), and remove it."""
    slots: SlotMounts = HOST_SLOTS
    with contextlib.suppress(OSError, ValueError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            pid = int((read_own_file(fd, _NAMESPACE_FILE) or "").strip())
        finally:
            os.close(fd)
        if os.path.exists(f"/proc/{pid}/ns/mnt"):
            slots = NamespaceSlots(pid)
    slots.unmount_below(path)
    HOST_SLOTS.unmount_below(path)
    shutil.rmtree(path, ignore_errors=True)


def sweep_dead_pools() -> list[str]:
    """Remove the pool directories (and their mounts) of processes that are gone."""
    removed = []
    for entry, fd in own_entries(user_dir("pools")):
        try:
            label = (read_own_file(fd, _OWNER_FILE) or "").strip()
        finally:
            os.close(fd)
        if entry.name.startswith(_PREFIX) and label and owner_is_gone(label):
            with contextlib.suppress(OSError):  # already going
                remove_pool_dir(str(entry))
                removed.append(str(entry))
    return removed


def _mounts_below(path: str, mountinfo: str) -> list[str]:
    """Mount points at or below ``path`` — as given: a path that resolves elsewhere (a link on
    the way) matches nothing — in a mount namespace (its ``mountinfo``)."""
    real = os.path.realpath(path)
    if real != os.path.normpath(path):
        return []
    try:
        table = mount_table(mountinfo)
    except OSError:
        return []
    return [m.point for m in table if m.point == real or m.point.startswith(real + "/")]
