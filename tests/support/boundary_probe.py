"""Run INSIDE a sandbox by tests/backends/test_session_boundary.py: a command trying every way at the
session's control path it could — the agent's and the relays' memory, environment, descriptors,
signals and ptrace, the agent's abstract socket, and (given a path) the socket directory.

``python3 boundary_probe.py [CONTROL_DIR]`` prints one JSON object: each attempt -> "allowed"
or "denied: <errno name>". Standard library only (it runs in the sandbox's python3).
"""

import ctypes
import errno
import json
import os
import signal
import socket
import sys

_PTRACE_ATTACH, _PTRACE_DETACH = 16, 17


def _outcome(attempt, *args):
    try:
        attempt(*args)
    except OSError as exc:
        return "denied: " + errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "allowed"


def _pids(word):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                    if word in cmdline.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                continue
    return found


def _read(path):
    with open(path, "rb") as source:
        source.read(64)


def _read_memory(pid):
    with open(f"/proc/{pid}/maps", encoding="ascii") as maps:
        start = int(maps.readline().split("-")[0], 16)
    with open(f"/proc/{pid}/mem", "rb") as memory:
        memory.seek(start)
        memory.read(16)


def _write_fd(pid, fd):
    with open(f"/proc/{pid}/fd/{fd}", "wb") as target:
        target.write(b"")


def _ptrace(pid):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(_PTRACE_ATTACH, pid, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    os.waitpid(pid, 0)  # attached: the tracee stops; let it go on
    libc.ptrace(_PTRACE_DETACH, pid, 0, 0)


def _abstract_names():
    with open("/proc/net/unix", encoding="ascii") as table:
        return sorted({line.split()[-1] for line in table.readlines()[1:]
                       if line.split()[-1].startswith("@toolseam-agent-")})


def _connect_abstract(name):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect("\0" + name[1:])


def probe(control_dir):
    results = {}
    targets = {"agent": _pids(b"--durable")[:1], "relay": _pids(b"--relay")[:1]}
    results["found"] = {name: bool(pids) for name, pids in targets.items()}
    for name, pids in targets.items():
        for pid in pids:
            results[f"{name} environ"] = _outcome(_read, f"/proc/{pid}/environ")
            results[f"{name} memory"] = _outcome(_read_memory, pid)
            results[f"{name} stdout"] = _outcome(_write_fd, pid, 1)
            results[f"{name} ptrace"] = _outcome(_ptrace, pid)
            results[f"{name} signal"] = _outcome(os.kill, pid, signal.SIGCONT)
    for name in _abstract_names():
        results["abstract connect"] = _outcome(_connect_abstract, name)
    if control_dir:
        sock = os.path.join(control_dir, "agent.sock")
        results["control listed"] = sorted(os.listdir(control_dir)) if os.path.isdir(
            control_dir) else "absent"
        results["control rename"] = _outcome(lambda: os.rename(sock, sock + ".moved"))
        results["control create"] = _outcome(
            lambda: os.close(os.open(os.path.join(control_dir, "planted"),
                                     os.O_CREAT | os.O_WRONLY, 0o600)))
        results["control bind"] = _outcome(lambda: _bind(os.path.join(control_dir, "fake.sock")))
    return results


def _bind(path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1] if len(sys.argv) > 1 else "")))
