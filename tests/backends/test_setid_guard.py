"""Bind mode never leaves a set-id program on the host (issue 18, point 8): the agent's seccomp
filter (``toolseam_agent/setid_guard.py``), checked three ways — its BPF program against a reference
rule for every arch, the real kernel on this machine, and commands in containers on a bind
mount of a host dir, where a rootful engine's commands run as uid 0."""

from __future__ import annotations

import errno
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam import ConfigurationError, Toolkit
from toolseam_agent import setid_guard as guard

from ..support.engines import ENGINES, backend, remove_shared, shared_dir

REPO = Path(__file__).resolve().parents[2]
_AGENT_ONLY = {"PYTHONPATH": str(REPO)}  # the checkout's toolseam_agent, for a bare interpreter


# --- the BPF program, run by a small classic-BPF interpreter ---------------------------------
def run_filter(program: bytes, nr: int, arch: int, args: tuple[int, ...]) -> int:
    data = struct.pack("=iIQ6Q", nr, arch, 0, *args)
    insns = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x54:
            acc &= k
        elif code == 0x06:
            return k
        elif code == 0x05:
            pc += k
        elif code in (0x15, 0x45, 0x35):
            taken = {0x15: acc == k, 0x45: bool(acc & k), 0x35: acc >= k}[code]
            pc += jt if taken else jf
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        pc += 1


def expected(nr: int, arch: int, args: tuple[int, ...]) -> int:
    """The rule, written plainly: what the filter must answer."""
    if arch not in guard.TABLES:
        return guard.RET_ERRNO | errno.ENOSYS
    if arch == guard.AUDIT_ARCH_X86_64 and nr >= guard.X32_SYSCALL_BIT:
        return guard.RET_ERRNO | errno.ENOSYS
    rule = guard.TABLES[arch].get(nr)
    if rule is None:
        return guard.RET_ALLOW
    if rule.refuse:
        return guard.RET_ERRNO | rule.refuse
    if rule.flags_arg >= 0 and not args[rule.flags_arg] & (guard.O_CREAT | guard.O_TMPFILE_BIT):
        return guard.RET_ALLOW
    mode = args[rule.mode_arg] & 0xFFFFFFFF
    if rule.device_check and stat.S_IFMT(mode) in (stat.S_IFCHR, stat.S_IFBLK):
        return guard.RET_ERRNO | errno.EPERM
    if mode & (stat.S_ISUID | stat.S_ISGID):
        return guard.RET_ERRNO | errno.EPERM
    return guard.RET_ALLOW


_ARCHES = [*guard.TABLES, 0x4000003E]  # and one the filter does not know
_PROGRAM = guard.program()


@st.composite
def calls(draw: st.DrawFn) -> tuple[int, int, tuple[int, ...]]:
    arch = draw(st.sampled_from(_ARCHES))
    known = sorted(guard.TABLES.get(arch, {}))
    nr = draw(st.sampled_from(known) | st.integers(0, 500) | st.integers(0, 2**31 - 1)
              if known else st.integers(0, 2**31 - 1))
    mode_bits = st.sampled_from([0, 0o644, 0o755, 0o4755, 0o2755, 0o6777, 0o1777, 0o20600,
                                 0o60600, 0o10644, 0o100644, 0o104755])
    flags = st.sampled_from([0, os.O_RDONLY, os.O_WRONLY | os.O_CREAT, os.O_RDWR | os.O_TRUNC,
                             0o20200000, 0o20000000])  # O_TMPFILE, __O_TMPFILE alone
    words = st.integers(0, 2**64 - 1)
    args = tuple(draw(words | mode_bits | flags) for _ in range(6))
    return nr, arch, args


@settings(max_examples=3000, deadline=None)
@given(calls())
def test_the_filter_answers_as_the_rule_says(call: tuple[int, int, tuple[int, ...]]) -> None:
    assert run_filter(_PROGRAM, *call) == expected(*call)


@pytest.mark.parametrize("arch", list(guard.TABLES))
def test_every_listed_call_with_a_setid_mode_is_refused(arch: int) -> None:
    for nr, rule in guard.TABLES[arch].items():
        args = [0] * 6
        if rule.flags_arg >= 0:
            args[rule.flags_arg] = os.O_CREAT | os.O_WRONLY
        if rule.mode_arg >= 0:
            args[rule.mode_arg] = 0o4755
        assert run_filter(_PROGRAM, nr, arch, tuple(args)) & 0xFFFF0000 == guard.RET_ERRNO, nr


def test_the_tables_match_this_machines_headers() -> None:
    """The numbers, against the kernel headers where they are installed (x86_64, i386 and the
    generic table aarch64 uses); fchmodat2 (452) is newer than these headers."""
    headers = {guard.AUDIT_ARCH_X86_64: "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
               guard.AUDIT_ARCH_I386: "/usr/include/x86_64-linux-gnu/asm/unistd_32.h",
               guard.AUDIT_ARCH_AARCH64: "/usr/include/asm-generic/unistd.h"}
    names = ("open", "creat", "mkdir", "mknod", "chmod", "fchmod", "openat", "mkdirat",
             "mknodat", "fchmodat", "io_uring_setup", "openat2")
    checked = 0
    for arch, header in headers.items():
        if not os.path.exists(header):
            continue
        numbers = {}
        for line in Path(header).read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "#define" and parts[1].startswith("__NR_"):
                numbers[parts[1][5:]] = parts[2]
        listed = {numbers[n] for n in names if n in numbers}
        assert listed == {str(nr) for nr in guard.TABLES[arch] if nr != 452}, arch
        checked += 1
    assert checked, "no kernel headers to check the numbers against"


# --- the real kernel, in a child process of this machine -------------------------------------
_PROBE = r"""
import errno, os, sys
from toolseam_agent import setid_guard
setid_guard.install()
os.chdir(sys.argv[1])
open("f", "w").close()
def attempt(name, call):
    try:
        call()
        print(name, "ok")
    except OSError as exc:
        print(name, errno.errorcode[exc.errno])
attempt("chmod 4755", lambda: os.chmod("f", 0o4755))
attempt("chmod 2755", lambda: os.chmod("f", 0o2755))
attempt("fchmod 6755", lambda: os.fchmod(os.open("f", os.O_RDONLY), 0o6755))
attempt("chmod 755", lambda: os.chmod("f", 0o755))
attempt("chmod 1777", lambda: os.chmod("f", 0o1777))
attempt("open 4755", lambda: os.open("g", os.O_CREAT | os.O_WRONLY, 0o4755))
attempt("open 644", lambda: os.open("h", os.O_CREAT | os.O_WRONLY, 0o644))
attempt("mkdir 2755", lambda: os.mkdir("d", 0o2755))
attempt("mknod chr", lambda: os.mknod("n", 0o20600, os.makedev(1, 3)))
attempt("mknod fifo", lambda: os.mkfifo("p"))
"""


def test_the_kernel_refuses_set_id_modes_under_the_filter(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "chmod 4755 EPERM", "chmod 2755 EPERM", "fchmod 6755 EPERM", "chmod 755 ok",
        "chmod 1777 ok", "open 4755 EPERM", "open 644 ok", "mkdir 2755 EPERM", "mknod chr EPERM",
        "mknod fifo ok"]
    assert not any(p.stat().st_mode & (stat.S_ISUID | stat.S_ISGID) for p in tmp_path.iterdir())


# --- containers: bind mode ---------------------------------------------------------------------
_ATTEMPTS = (
    "cp /bin/true a; chmod 4755 a; "
    "cp /bin/true b; chmod 2755 b; "
    "cp /bin/true c; chmod u+s,g+s c; "
    "install -m 4755 /bin/true d; "
    "python3 -c 'import os; os.close(os.open(\"e\", os.O_CREAT | os.O_WRONLY, 0o4755))'; "
    "cp -p /usr/bin/passwd f; cp -a /bin/su g; "
    "mkdir h; chmod g+s h; mkdir -m 2775 i; "
    "python3 -c 'import os; os.setxattr(\"a\", \"security.capability\", "
    "bytes.fromhex(\"0000000200000000000000000000000000000000\"))' 2>/dev/null "
    "|| echo no-file-capabilities; "
    "cp /bin/true ok; chmod 755 ok; echo hi > plain; chmod 644 plain; ls -l ok plain | wc -l")


@pytest.mark.parametrize("engine", ENGINES)
async def test_no_set_id_file_reaches_the_host(engine: str, workspace: Path) -> None:
    async with Toolkit(backend(engine, str(workspace), workspace_mode="bind")) as tk:
        result = await tk.call("bash", {"command": _ATTEMPTS})
        setid = {p.name: oct(p.stat().st_mode) for p in workspace.iterdir()
                 if p.stat().st_mode & (stat.S_ISUID | stat.S_ISGID)}
        assert setid == {}
        assert result.output.splitlines()[-2:] == ["no-file-capabilities", "2"], result.output
        assert "Operation not permitted" in result.output
        assert stat.S_IMODE((workspace / "ok").stat().st_mode) == 0o755
        assert stat.S_IMODE((workspace / "plain").stat().st_mode) == 0o644
        assert os.listxattr(workspace / "a") == []


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_command_started_by_the_guard_holds_no_descriptor_of_the_agent(
        engine: str, workspace: Path) -> None:
    """The guard's hand-off pipes (and every other descriptor of the agent) are close-on-exec:
    a command started on the guard's thread has stdin, stdout, stderr and nothing else."""
    async with Toolkit(backend(engine, str(workspace), workspace_mode="bind")) as tk:
        guarded = await tk.call("bash", {"command": "touch f; chmod 4755 f 2>&1; true"})
        result = await tk.call("bash", {"command": "ls /proc/self/fd"})
    assert "Operation not permitted" in guarded.output  # the command ran under the guard
    # 0, 1, 2 and the descriptor ``ls`` itself opens to read the directory
    assert sorted(int(fd) for fd in result.output.split()) == [0, 1, 2, 3], result.output


# --- where the filter cannot be installed: qemu-user refuses seccomp ---------------------------
_SPAWN = r"""
import os
from toolseam_agent import jobs
try:
    r, w = os.pipe()
    pid = jobs.spawn(["/bin/true"], "/", {}, (w, w))
    print("started", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
except jobs.SpawnError as exc:
    print("refused", exc.errno, exc.strerror)
"""


@pytest.mark.parametrize("mode", ["require", "try"])
def test_without_the_filter_require_starts_nothing(mode: str) -> None:
    """The agent under qemu-user (as the arm64 bundle runs in the suite): qemu answers EINVAL
    to seccomp. ``require`` (bind mode) refuses every command, naming why; ``try`` runs it."""
    qemu = "/usr/bin/qemu-x86_64-static"
    if not os.path.exists(qemu) or os.uname().machine != "x86_64":
        if os.environ.get("TOOLSEAM_REQUIRE_ENGINES"):
            pytest.fail(f"{qemu} is missing (scripts/setup-cross.sh installs qemu-user)")
        pytest.skip(f"{qemu} is missing")
    out = subprocess.run([qemu, sys.executable, "-s", "-c", _SPAWN],
                         env={guard.MODE_VAR: mode, "PATH": "/usr/bin:/bin", **_AGENT_ONLY},
                         capture_output=True, text=True, check=True).stdout.strip()
    if mode == "try":
        assert out == "started 0"
    else:
        assert out == ("refused 1 the sandbox's set-id guard could not be installed "
                       "(prctl(PR_SET_SECCOMP): Invalid argument); no command is started "
                       "without it")


SETID = "cp /bin/true a; chmod 4755 a; stat -c %a a"


@pytest.mark.parametrize("engine", ["docker-remote", "podman-remote", "docker:copy",
                                    "podman-rootless:copy"])
async def test_copy_mode_lets_commands_make_set_id_files_that_never_come_home(
        engine: str, workspace: Path) -> None:
    """Decision 146: in copy mode the copy-back's mode mask is the boundary, so a step that
    builds set-id programs works in its own container — and none comes home set-id."""
    name, _, copy = engine.partition(":")
    options = {"workspace_mode": "copy"} if copy else {}
    async with Toolkit(backend(name, str(workspace), **options)) as tk:
        made = await tk.call("bash", {"command": SETID})
        assert made.output.strip() == "4755", made.output
    assert (workspace / "a").exists()
    assert not (workspace / "a").stat().st_mode & 0o6000  # stripped on the way home


@pytest.mark.parametrize("engine", ["docker-remote", "podman-rootless:copy"])
async def test_copy_mode_can_refuse_set_id_files(engine: str, workspace: Path) -> None:
    name, _, copy = engine.partition(":")
    options = {"workspace_mode": "copy"} if copy else {}
    async with Toolkit(backend(name, str(workspace), setid_files="refuse", **options)) as tk:
        result = await tk.call("bash", {"command": SETID})
    assert "Operation not permitted" in result.output and result.output.endswith("755\n")


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_rootless_bind_mode_refuses_by_default_and_allows_when_asked(
        workspace: Path) -> None:
    """Rootless podman's root is an unprivileged host user: the set-id file it makes in the
    bind-mounted workspace is that user's, so "allow" is a choice a host may make."""
    async with Toolkit(backend("podman-rootless", str(workspace))) as tk:
        refused = await tk.call("bash", {"command": SETID})
    assert "Operation not permitted" in refused.output
    (workspace / "a").unlink()
    async with Toolkit(backend("podman-rootless", str(workspace), setid_files="allow")) as tk:
        allowed = await tk.call("bash", {"command": SETID})
    assert allowed.output.strip() == "4755", allowed.output
    made = (workspace / "a").stat()
    assert made.st_uid != 0  # the engine's user's, never host root's
    (workspace / "a").unlink()


@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_a_rootful_bind_mode_cannot_allow_set_id_files(engine: str, workspace: Path) -> None:
    with pytest.raises(ConfigurationError, match="host root"):
        async with Toolkit(backend(engine, str(workspace), setid_files="allow"),
                           raise_could_not_run=True) as tk:
            await tk.call("bash", {"command": "true"})


@pytest.mark.engines  # needs an engine without naming it in a parameter
def test_a_bad_setting_names_the_values() -> None:
    with pytest.raises(ConfigurationError, match="setid_files must be"):
        backend("docker", "/tmp", setid_files="sometimes")


def test_the_guard_reports_its_state_before_any_command() -> None:
    """What the agent's hello carries: known before the first command."""
    probe = "from toolseam_agent import setid_guard; print(setid_guard.status())"
    for mode, said in (("off", "off"), ("require", "active")):
        out = subprocess.run([sys.executable, "-s", "-c", probe],
                             env={guard.MODE_VAR: mode, **_AGENT_ONLY},
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out == said
    qemu = "/usr/bin/qemu-x86_64-static"
    if os.path.exists(qemu):
        out = subprocess.run([qemu, sys.executable, "-s", "-c", probe],
                             env={guard.MODE_VAR: "require", **_AGENT_ONLY}, capture_output=True, text=True,
                             check=True).stdout.strip()
        assert out == "unavailable: prctl(PR_SET_SECCOMP): Invalid argument"


@pytest.mark.parametrize("engine", ["docker", "podman", "podman-rootless"])
async def test_a_rootful_bind_mode_open_says_commands_act_as_host_root(
        engine: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 18 point 8: where the engine cannot map container root to another uid, the open
    says so (never silently host root); rootless podman's root is the unprivileged user."""
    base = shared_dir()
    try:
        with caplog.at_level("WARNING", logger="toolseam.backends.containers.modes.bind"):
            async with Toolkit(backend(engine, str(base), workspace_mode="bind")):
                pass
        said = [r.getMessage() for r in caplog.records if "host root" in r.getMessage()]
        if engine == "podman-rootless":
            assert said == []
        else:
            assert len(said) == 1 and str(base) in said[0] and "rootless podman" in said[0]
    finally:
        remove_shared(base)


_FORKED = """
import os
from toolseam_agent import setid_guard as guard
assert guard.start_command(lambda: 'parent') == 'parent'
pid = os.fork()
if pid == 0:  # a search child: the guard it sees is its own, made when first asked
    fresh = guard._guard is None
    os._exit(0 if fresh and guard.start_command(lambda: 'child') == 'child' else 1)
_, status = os.waitpid(pid, 0)
answers = [guard.start_command(lambda n=n: n) for n in range(50)]
print(os.waitstatus_to_exitcode(status), answers == list(range(50)))
"""


def test_a_forked_child_never_wakes_its_parents_guard() -> None:
    """The hand-off goes through pipes a fork shares: a child that started a command through
    its parent's guard would run the parent's spawn and answer the parent's next one."""
    out = subprocess.run([sys.executable, "-c", _FORKED],
                         env={guard.MODE_VAR: "try", "PATH": "/usr/bin:/bin", **_AGENT_ONLY},
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "0 True"
