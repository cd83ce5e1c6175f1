"""What a command on the host backend can see of the host: no secrets, no fds, no ancestors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from toolseam import Toolkit
from toolseam.backends.host import HostBackend
from toolseam.seam.errors import CouldNotRunError

SECRET = "s3cr3t-value-that-must-not-leak"


@pytest_asyncio.fixture
async def tk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Toolkit]:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("GITHUB_TOKEN", SECRET)
    monkeypatch.setenv("MY_SECRET_THING", SECRET)
    monkeypatch.setenv("HARMLESS_SETTING", "visible")
    async with Toolkit("host", base_dir=str(tmp_path)) as toolkit:
        yield toolkit


async def test_secrets_are_not_in_the_command_environment(tk: Toolkit) -> None:
    result = await tk.call("bash", {"command": "env"})
    assert SECRET not in result.output
    assert "HARMLESS_SETTING=visible" in result.output


async def test_no_ancestor_environ_leaks_the_secret(tk: Toolkit) -> None:
    # Walk every ancestor the command can see and dump its environ.
    script = ("pid=$$; while [ \"$pid\" -gt 1 ] 2>/dev/null; do "
              "cat /proc/$pid/environ 2>/dev/null | tr '\\0' '\\n'; "
              "pid=$(awk '/^PPid:/ {print $2}' /proc/$pid/status); done; "
              "cat /proc/1/environ | tr '\\0' '\\n'; echo; echo walked")
    result = await tk.call("bash", {"command": script})
    assert result.output.rstrip().endswith("walked")
    assert SECRET not in result.output
    # and the host process itself is invisible from inside the namespace
    assert tk.info is not None and tk.info.pid_namespace
    search = await tk.call("bash", {"command": f"grep -l {SECRET} /proc/*/environ 2>/dev/null; true"})
    assert search.output == ""
    assert os.getpid() > 1


async def test_allow_listed_variable_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from toolseam import Settings

    monkeypatch.setenv("DEPLOY_TOKEN", "allowed-value")
    async with Toolkit("host", base_dir=str(tmp_path),
                       settings=Settings(env_allow=["DEPLOY_TOKEN"])) as tk:
        assert (await tk.call("bash", {"command": "echo $DEPLOY_TOKEN"})).output == "allowed-value\n"


async def test_stdin_is_dev_null_and_no_extra_fds(tk: Toolkit) -> None:
    result = await tk.call("bash", {"command": "cat; readlink /proc/self/fd/0; ls /proc/self/fd"})
    lines = result.output.split()
    assert lines[0] == "/dev/null"
    # 0, 1, 2 and the fd `ls` itself opens to read the directory
    assert sorted(int(fd) for fd in lines[1:]) == [0, 1, 2, 3]


# Every way a command might uncover the host's /proc, each followed by all it can read there.
READ_ALL = ("for f in /proc/[0-9]*/environ m/[0-9]*/environ r/proc/[0-9]*/environ; do cat $f; "
            "echo; done 2>/dev/null; cat /proc/[0-9]*/cmdline m/[0-9]*/cmdline 2>/dev/null "
            "| tr \"\\0\" \" \"; echo; ls /proc | grep -c \"^[0-9]\"; echo done")  # no ': see below
UNCOVER = [
    f"umount -l /proc 2>/dev/null; {READ_ALL}",
    f"umount /proc 2>/dev/null; {READ_ALL}",
    f"mkdir -p m; mount -t proc proc m 2>/dev/null; {READ_ALL}",
    f"mkdir -p r; mount --rbind / r 2>/dev/null; umount -l r/proc 2>/dev/null; {READ_ALL}",
    f"unshare -r -m sh -c 'umount -l /proc 2>/dev/null; {READ_ALL}'",
    f"mount -t proc proc /proc 2>/dev/null; {READ_ALL}",
]
HOST = """
import asyncio, json, sys
from toolseam import Toolkit
from toolseam.backends.host import HostBackend
async def main() -> None:
    # the system's python: the venv's interpreter may sit in a home another user cannot enter
    backend = HostBackend(sys.argv[1], python="/usr/bin/python3")
    async with Toolkit(backend, base_dir=sys.argv[1]) as tk:
        assert tk.info is not None and tk.info.pid_namespace
        for command in json.loads(sys.argv[3]):
            print((await tk.call("bash", {"command": command})).output)
asyncio.run(main())
"""


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_command_cannot_uncover_the_hosts_proc(user: str) -> None:
    """The host process (its secret in its environment since exec, a marker in its command
    line) stays invisible whatever a command does to /proc. As root, `umount -l /proc` used to
    uncover the host's; a plain user's commands hold no capability there (kept as a guard)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: one case is root, the other starts a host as nobody")
    base = Path(tempfile.mkdtemp(prefix="toolseam-test-proc-"))  # pytest's tmp is 0700 root's
    marker = f"host-marker-{uuid.uuid4().hex}"
    as_user = [] if user == "root" else ["setpriv", "--reuid=65534", "--regid=65534",
                                         "--clear-groups"]
    if user != "root":
        os.chown(base, 65534, 65534)
    try:
        run = subprocess.run(
            [*as_user, sys.executable, "-c", HOST, str(base), marker, json.dumps(UNCOVER)],
            capture_output=True, text=True, timeout=120, cwd=str(base),
            env={"PATH": os.environ["PATH"], "FOO_TOKEN": SECRET,
                 "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    finally:
        shutil.rmtree(base)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("done\n") == len(UNCOVER)
    assert SECRET not in run.stdout
    assert marker not in run.stdout
    counts = [int(line) for line in run.stdout.splitlines() if line.isdigit()]
    assert max(counts) < 10  # the agent, the shell and what it runs — not the host's hundreds


async def test_files_a_command_makes_keep_the_hosts_owner(tk: Toolkit, tmp_path: Path) -> None:
    result = await tk.call("bash", {"command": "mkdir d && touch d/f && id -u"})
    assert result.output == f"{os.geteuid()}\n"
    assert (tmp_path / "d" / "f").stat().st_uid == os.geteuid()
    assert (tmp_path / "d" / "f").stat().st_gid == os.getegid()


async def test_the_file_tools_never_read_a_process_environment(tk: Toolkit, tmp_path: Path) -> None:
    """They run in this process on the host backend: its environ holds the unfiltered secrets."""
    (tmp_path / "link").symlink_to(f"/proc/{os.getppid()}/environ")
    for args in ({"path": "/proc/self/environ"}, {"path": "/proc/thread-self/environ"},
                 {"path": f"/proc/{os.getpid()}/task/{os.getpid()}/environ"}, {"path": "link"},
                 {"path": "/proc/self/mem"}):
        result = await tk.call("read", args)
        assert result.is_error and "permission denied" in result.output, result.output
    grep = await tk.call("grep", {"pattern": "PATH", "path": "/proc/self/environ"})
    assert "PATH" not in grep.output and SECRET not in grep.output
    assert "processor" in (await tk.call("read", {"path": "/proc/cpuinfo"})).output


def test_a_refused_user_namespace_is_an_oserror_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent then goes on in its pid namespace (better than none) and says so in `hello`."""
    from toolseam_agent import userns

    before = os.readlink("/proc/self/ns/user")
    monkeypatch.setattr(userns, "_CLONE_NEWUSER", 0x1)  # not a namespace flag: EINVAL
    monkeypatch.setattr(userns, "_CLONE_NEWNS", 0)
    with pytest.raises(OSError, match=r"unshare\(CLONE_NEWUSER\|CLONE_NEWNS\): Invalid argument"):
        userns.enter_own_user_namespace()
    assert os.readlink("/proc/self/ns/user") == before


async def test_the_file_tools_never_open_through_a_proc_link(tk: Toolkit, tmp_path: Path) -> None:
    """/proc/self/fd/N, /dev/stdin and /proc/self/cwd are this process's own files, pipes and
    directory on the host backend; /proc/self/root leads out of any mount namespace."""
    (tmp_path / "in.txt").write_text("inside\n")
    (tmp_path / "to-fd").symlink_to("/proc/self/fd/0")
    with open(tmp_path / "in.txt", encoding="utf-8") as held:
        for path in (f"/proc/self/fd/{held.fileno()}", "/dev/stdin", "/dev/fd/0", "to-fd",
                     f"/proc/self/root{tmp_path}/in.txt", f"/proc/{os.getpid()}/cwd/README.md"):
            result = await tk.call("read", {"path": path})
            # refused either way: by toolseam's own check, or (a pid whose cwd the agent's
            # namespace resolves through a magic link) by the kernel's RESOLVE_NO_MAGICLINKS
            refused = ("permission denied" in result.output
                       or "Too many levels of symbolic links" in result.output)
            assert result.is_error and refused, (path, result.output)
    assert (await tk.call("read", {"path": "in.txt"})).output.startswith("00001| inside")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert "permission denied" not in (await tk.call("read", {"path": "loop"})).output


async def test_an_agent_of_another_protocol_is_could_not_run_naming_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host checks the protocol version the agent's hello carries (issue 20)."""
    from toolseam.backends.agentlink import channel
    from toolseam_agent.wire import PROTOCOL_VERSION

    monkeypatch.setattr(channel, "PROTOCOL_VERSION", PROTOCOL_VERSION + 1)
    backend = HostBackend(str(tmp_path))
    with pytest.raises(CouldNotRunError) as caught:
        await backend.open()
    await backend.close()
    said = str(caught.value)
    assert f"protocol {PROTOCOL_VERSION}," in said and f"protocol {PROTOCOL_VERSION + 1}" in said
    assert not caught.value.retryable
