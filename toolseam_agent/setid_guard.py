"""No command can make a set-user-ID or set-group-ID file, nor a device node: a seccomp filter
on the thread that starts commands, so every command and everything it starts carries it.

Why: on a rootful engine in bind mode a command runs as uid 0 on a bind mount of the host's
base dir, so ``cp /bin/true x; chmod 4755 x`` would leave a setuid-root program on the host
for any local user to run (a ``nosuid`` mount only counts inside the container). A user
namespace would fix it at the root, but neither engine offers one per container here: podman's
``--userns=auto`` needs ``/etc/subuid`` ranges for ``containers`` and idmapped bind mounts
(crun, or runc >= 1.2), docker's ``userns-remap`` is daemon-wide (docs/decisions.md).

The filter answers ``EPERM`` to

* ``chmod``/``fchmod``/``fchmodat``/``fchmodat2`` whose mode carries S_ISUID or S_ISGID;
* ``open``/``openat``/``creat`` that create (O_CREAT, O_TMPFILE) with such a mode;
* ``mkdir``/``mkdirat`` with such a mode, and ``mknod``/``mknodat`` with such a mode or of a
  character or block device (CAP_MKNOD is dropped too; this holds if a host turns it back on);
* ``io_uring_setup``: io_uring's own open calls never pass through seccomp;

and ``ENOSYS`` to ``openat2`` (its mode sits behind a pointer seccomp cannot read; libc falls
back to ``openat``) and to x32 system calls. Everything else is allowed, and the engine's own
seccomp profile still applies: filters stack, the strictest answer wins. Each CPU's numbers are
used under its audit arch (x86_64 with i386, aarch64 with 32-bit arm), so a 32-bit program
cannot go round the filter. Installing needs ``no_new_privs`` (set here; the engines set it
for the container anyway) and stays with the thread and its descendants forever.

The filter is on a thread of its own, not on the agent: the agent's file operations (which may
keep an existing file's mode) are not the sandbox's commands. The agent is not dumpable, so no
command can ptrace it to make the calls for it.

Stdlib only: the program is classic BPF built with ``struct``, installed with ``prctl``
through ``ctypes``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
from collections.abc import Callable
from typing import Literal, NamedTuple, TypeVar

from . import landlock

T = TypeVar("T")

# Which behaviour the agent was started with: the container backends set it (bind mode:
# "require" — a command must never run without the filter; copy mode: "try").
MODE_VAR = "TOOLSEAM_SETID_GUARD"
Mode = Literal["off", "try", "require"]

S_ISUID, S_ISGID = 0o4000, 0o2000
S_IFMT, S_IFCHR, S_IFBLK = 0o170000, 0o020000, 0o060000
O_CREAT, O_TMPFILE_BIT = 0o100, 0o20000000  # the same on x86_64, i386, aarch64 and arm
X32_SYSCALL_BIT = 0x40000000

# classic BPF
_LD_ABS_W = 0x20
_JEQ_K, _JSET_K, _JGE_K, _JA = 0x15, 0x45, 0x35, 0x05
_AND_K = 0x54
_RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
_OFF_NR, _OFF_ARCH, _OFF_ARGS = 0, 4, 16  # struct seccomp_data; args are u64, low word first

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


class Rule(NamedTuple):
    """One system call: which argument holds the mode, which the open flags (or -1), and
    whether it is refused whatever its arguments (then with ``errno``)."""

    mode_arg: int = -1
    flags_arg: int = -1
    device_check: bool = False
    refuse: int = 0


_CHMOD1, _CHMOD2 = Rule(mode_arg=1), Rule(mode_arg=2)
_OPEN = Rule(mode_arg=2, flags_arg=1)
_OPENAT = Rule(mode_arg=3, flags_arg=2)
_MKNOD1, _MKNOD2 = Rule(mode_arg=1, device_check=True), Rule(mode_arg=2, device_check=True)
_IO_URING = Rule(refuse=errno.EPERM)
_OPENAT2 = Rule(refuse=errno.ENOSYS)

# audit arch -> syscall number -> rule. Numbers from each architecture's unistd table.
AUDIT_ARCH_X86_64, AUDIT_ARCH_I386 = 0xC000003E, 0x40000003
AUDIT_ARCH_AARCH64, AUDIT_ARCH_ARM = 0xC00000B7, 0x40000028
TABLES: dict[int, dict[int, Rule]] = {
    AUDIT_ARCH_X86_64: {2: _OPEN, 85: _CHMOD1, 83: _CHMOD1, 133: _MKNOD1, 90: _CHMOD1,
                        91: _CHMOD1, 257: _OPENAT, 258: _CHMOD2, 259: _MKNOD2, 268: _CHMOD2,
                        452: _CHMOD2, 425: _IO_URING, 437: _OPENAT2},
    AUDIT_ARCH_I386: {5: _OPEN, 8: _CHMOD1, 39: _CHMOD1, 14: _MKNOD1, 15: _CHMOD1, 94: _CHMOD1,
                      295: _OPENAT, 296: _CHMOD2, 297: _MKNOD2, 306: _CHMOD2, 452: _CHMOD2,
                      425: _IO_URING, 437: _OPENAT2},
    AUDIT_ARCH_AARCH64: {56: _OPENAT, 34: _CHMOD2, 33: _MKNOD2, 52: _CHMOD1, 53: _CHMOD2,
                         452: _CHMOD2, 425: _IO_URING, 437: _OPENAT2},
    AUDIT_ARCH_ARM: {5: _OPEN, 8: _CHMOD1, 39: _CHMOD1, 14: _MKNOD1, 15: _CHMOD1, 94: _CHMOD1,
                     322: _OPENAT, 323: _CHMOD2, 324: _MKNOD2, 333: _CHMOD2, 452: _CHMOD2,
                     425: _IO_URING, 437: _OPENAT2},
}
NATIVE = {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}


def _insn(code: int, k: int = 0, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _rule_code(rule: Rule) -> list[bytes]:
    """The instructions after "this is the call": each path ends in its own return."""
    if rule.refuse:
        return [_insn(_RET_K, RET_ERRNO | rule.refuse)]
    deny, allow = _insn(_RET_K, RET_ERRNO | errno.EPERM), _insn(_RET_K, RET_ALLOW)
    mode = _insn(_LD_ABS_W, _OFF_ARGS + 8 * rule.mode_arg)
    tail = [mode, _insn(_JSET_K, S_ISUID | S_ISGID, 0, 1), deny, allow]
    if rule.device_check:  # A = mode & S_IFMT; a device: deny; else reload the mode
        tail = [mode, _insn(_AND_K, S_IFMT), _insn(_JEQ_K, S_IFCHR, 2, 0),
                _insn(_JEQ_K, S_IFBLK, 1, 0), _insn(_JA, 1), deny, *tail]
    if rule.flags_arg >= 0:  # the mode means something only when the call creates
        tail = [_insn(_LD_ABS_W, _OFF_ARGS + 8 * rule.flags_arg),
                _insn(_JSET_K, O_CREAT | O_TMPFILE_BIT, 0, len(tail) - 1), *tail]
    return tail


def _arch_code(arch: int) -> list[bytes]:
    code = [_insn(_LD_ABS_W, _OFF_NR)]
    if arch == AUDIT_ARCH_X86_64:  # x32 calls share the arch: refuse them all
        code += [_insn(_JGE_K, X32_SYSCALL_BIT, 0, 1), _insn(_RET_K, RET_ERRNO | errno.ENOSYS)]
    for number, rule in sorted(TABLES[arch].items()):
        body = _rule_code(rule)
        code += [_insn(_JEQ_K, number, 0, len(body)), *body]
    return [*code, _insn(_RET_K, RET_ALLOW)]


def program() -> bytes:
    """The whole filter: dispatch on the audit arch, then that arch's calls. An arch it does
    not know (none on x86_64 or aarch64 machines) gets ENOSYS for every call."""
    blocks = [(arch, _arch_code(arch)) for arch in TABLES]
    dispatch: list[bytes] = [_insn(_LD_ABS_W, _OFF_ARCH)]
    # per arch: "jeq arch, 0, 1" then "ja <block>"; then the unknown-arch return
    after_dispatch = 2 * len(blocks) + 1
    offset = 0
    for index, (arch, block) in enumerate(blocks):
        to_block = after_dispatch - (2 * index + 2) + offset
        dispatch += [_insn(_JEQ_K, arch, 0, 1), _insn(_JA, to_block)]
        offset += len(block)
    dispatch.append(_insn(_RET_K, RET_ERRNO | errno.ENOSYS))
    return b"".join(dispatch + [insn for _, block in blocks for insn in block])


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> None:
    """Install the filter on the calling thread (and so on everything it starts after).

    Raises:
        OSError: the kernel or the runtime refused (no seccomp filters, a CPU this module has
            no table for, qemu-user, which refuses seccomp).
    """
    machine = os.uname().machine
    if machine not in NATIVE:
        raise OSError(errno.ENOSYS, f"no system call table for {machine}")
    code = program()
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    for name, args in (("PR_SET_NO_NEW_PRIVS", (_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)),
                       ("PR_SET_SECCOMP", (_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER,
                                           ctypes.addressof(prog), 0, 0))):
        if libc.prctl(*(ctypes.c_ulong(a) for a in args)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl({name}): {os.strerror(err)}")


class Guard:
    """The thread commands are started on: the filter is installed on it once, at its start.
    ``run(start)`` calls ``start`` there; with ``require``, a thread without the filter
    refuses (``OSError(EPERM)`` naming why), so no command ever runs unguarded.

    The hand-off is a byte through a pipe each way, not an executor and not locks: every bash
    call passes here. A ``ThreadPoolExecutor`` round trip (future, work item, queue, condition)
    cost the agent ≈ 100 µs of CPU per command (decision 122); two locks used as semaphores
    53-59 µs wall and 30-43 µs CPU a round trip here, because a futex wakes the guard thread
    onto its previous CPU when that one is idle, and the two threads drift apart (waking a
    halted vCPU is most of the cost); a pipe's wakeup is a "sync" one, and with it the threads
    stay on one CPU: 2.8 µs (decision 141)."""

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.failure: OSError | None = None
        self.domain = "off"  # the commands' Landlock domain (landlock.py), for the hello
        self._go_r, self._go_w = os.pipe()  # close-on-exec: no command inherits them
        self._done_r, self._done_w = os.pipe()
        self._calls = threading.Lock()  # one caller at a time (the agent's loop is one thread)
        self._start: Callable[[], object] | None = None
        self._outcome: tuple[bool, object] = (True, None)
        self._thread: threading.Thread | None = None

    def _serve(self) -> None:
        if self.mode != "off":
            try:
                install()
            except OSError as exc:
                self.failure = exc
        wanted, control = landlock.configured()
        if wanted:  # the control path out of every command's reach: landlock.py
            try:
                self.domain = landlock.restrict_thread(control)
            except OSError as exc:
                self.domain = f"unavailable: {exc.strerror}"
        os.write(self._done_w, b"\0")  # installed (or not): ready() returns
        while True:
            os.read(self._go_r, 1)
            start, self._start = self._start, None
            try:
                self._outcome = (True, self._checked(start))  # type: ignore[arg-type]
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                self._outcome = (False, exc)
            os.write(self._done_w, b"\0")

    def run(self, start: Callable[[], T]) -> T:
        with self._calls:
            self.ready()
            self._start = start
            os.write(self._go_w, b"\0")
            os.read(self._done_r, 1)
            ok, value = self._outcome
            self._outcome = (True, None)
        if not ok:
            raise value  # type: ignore[misc]
        return value  # type: ignore[return-value]

    def _checked(self, start: Callable[[], T]) -> T:
        if self.failure is not None and self.mode == "require":
            raise OSError(errno.EPERM, "the sandbox's set-id guard could not be installed "
                          f"({self.failure.strerror}); no command is started without it")
        return start()

    def ready(self) -> None:
        """Start the thread (the filter is installed first thing) and wait for it."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="setid-guard", daemon=True)
            self._thread.start()
            os.read(self._done_r, 1)


_guard: Guard | None = None
_mode: str | None = None  # MODE_VAR as the agent was started with (read once: every spawn asks)


def _forget_guard_in_child() -> None:
    """A forked child (a search) shares the guard's pipes but not its thread: were it ever to
    start a command, it must make a guard of its own, never wake its parent's."""
    global _guard
    _guard = None


os.register_at_fork(after_in_child=_forget_guard_in_child)


def _the_guard() -> Guard | None:
    global _guard, _mode
    if _mode is None:
        _mode = os.environ.get(MODE_VAR, "off")
    if _mode not in ("try", "require") and not landlock.configured()[0]:
        return None
    if _guard is None:
        _guard = Guard(_mode if _mode in ("try", "require") else "off")  # type: ignore[arg-type]
    return _guard


_forked_from_guard = False


def forked_from_guard() -> None:
    """This process was forked on the guard's thread (a job's root, ``jobroot.py``): its one
    thread carries the filter and the domain already, so commands are started right here."""
    global _forked_from_guard
    _forked_from_guard = True


def start_command(start: Callable[[], T]) -> T:
    """Call ``start`` (a spawn) where the agent's mode says: the guard's thread, or here."""
    if _forked_from_guard:
        return start()
    guard = _the_guard()
    return start() if guard is None else guard.run(start)


def status() -> str:
    """For the agent's hello: ``off``, ``active`` or ``unavailable: REASON`` (the guard's
    thread is started now, so the answer is known before the first command)."""
    guard = _the_guard()
    if guard is None or guard.mode == "off":
        return "off"
    guard.ready()
    return "active" if guard.failure is None else f"unavailable: {guard.failure.strerror}"


def domain_status() -> str:
    """For the agent's hello: the commands' Landlock domain (``landlock.py``): ``off``, what
    it holds, or ``unavailable: REASON``."""
    guard = _the_guard()
    if guard is None:
        return "off"
    guard.ready()
    return guard.domain
