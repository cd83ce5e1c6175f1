"""Read scope (CONTRACT §8): what asks, what never asks, and how each answer behaves."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

from toolseam import ReadQuestion, Settings, Toolkit
from toolseam.policy.readscope import _without_proc_links, user_named_paths

from ..support.processes import scratch_root


@pytest.fixture
def root() -> Iterator[Path]:
    # Not under /tmp: the OS temp dirs are always in scope, which would hide every question.
    base = scratch_root() / uuid.uuid4().hex[:8]
    (base / "work").mkdir(parents=True)
    (base / "work" / "in.txt").write_text("inside\n")
    for name in ("a", "b"):
        (base / "home" / "other" / name).mkdir(parents=True)
        (base / "home" / "other" / name / "f.txt").write_text(f"{name}\n")
        (base / "home" / "other" / name / "g.txt").write_text(f"{name}g\n")
    (base / "home" / "me").mkdir()
    yield base
    shutil.rmtree(base)


@dataclass
class Approver:
    answers: list[str]
    asked: list[ReadQuestion] = field(default_factory=list)
    delay: float = 0.0

    async def __call__(self, question: ReadQuestion) -> str:
        self.asked.append(question)
        await asyncio.sleep(self.delay)
        return self.answers.pop(0)


def toolkit(root: Path, approver: Approver | None, scope: str = "working-dir") -> Toolkit:
    env = {"PATH": os.environ["PATH"], "HOME": str(root / "home" / "me")}
    return Toolkit("host", base_dir=str(root / "work"), settings=Settings(read_scope=scope),
                   approver=approver, env=env)  # type: ignore[arg-type]


@pytest_asyncio.fixture
async def never_asked(root: Path) -> AsyncIterator[Toolkit]:
    async with toolkit(root, Approver([])) as tk:
        yield tk


async def test_inside_temp_and_system_reads_never_ask(never_asked: Toolkit, root: Path) -> None:
    assert (await never_asked.call("read", {"path": "in.txt"})).output.startswith("00001| inside\n")
    assert not (await never_asked.call("read", {"path": "/etc/hostname"})).is_error
    assert not (await never_asked.call("glob", {"pattern": "*", "path": "/tmp"})).is_error
    assert not (await never_asked.call("bash", {"command": "/usr/bin/env true"})).is_error


async def test_no_approver_refuses_with_the_exact_line(root: Path) -> None:
    async with toolkit(root, None) as tk:
        target = root / "home" / "other" / "a" / "f.txt"
        result = await tk.call("read", {"path": str(target)})
    assert result.is_error and result.metadata == {"refused": True}
    assert result.output == (f"read: {target} is outside the working directory {root / 'work'} "
                             "and reading it was not approved; a host can set read_scope = "
                             "\"unrestricted\" to turn this check off")


async def test_user_named_file_widens_to_that_file_only(root: Path) -> None:
    approver = Approver(["deny"])
    async with toolkit(root, approver) as tk:
        named = root / "home" / "other" / "a" / "f.txt"
        tk.user_message(f"Please look at {named}.")
        assert (await tk.call("read", {"path": str(named)})).output.startswith("00001| a\n")
        assert approver.asked == []
        sibling = await tk.call("read", {"path": str(named.with_name("g.txt"))})
        assert sibling.is_error and len(approver.asked) == 1


async def test_user_named_directory_widens_to_the_directory(root: Path) -> None:
    async with toolkit(root, Approver([])) as tk:
        tk.user_message(f"the logs are in '{root / 'home' / 'other' / 'a'}'")
        result = await tk.call("grep", {"pattern": ".", "path": str(root / "home" / "other" / "a")})
        assert result.output == "f.txt:1:a\ng.txt:1:ag"


async def test_a_path_the_model_reads_is_no_grant(root: Path) -> None:
    approver = Approver(["once", "deny"])
    async with toolkit(root, approver) as tk:
        target = str(root / "home" / "other" / "a" / "f.txt")
        assert (await tk.call("read", {"path": target})).output.startswith("00001| a\n")  # once
        assert (await tk.call("read", {"path": target})).is_error  # asked again: denied
        assert [q.path for q in approver.asked] == [target, target]
        assert approver.asked[0].workdir == str(root / "work")
        assert set(approver.asked[0].choices) == {"once", "directory", "session", "deny"}


async def test_directory_and_session_answers(root: Path) -> None:
    approver = Approver(["directory", "session"])
    async with toolkit(root, approver) as tk:
        a = root / "home" / "other" / "a"
        assert not (await tk.call("read", {"path": str(a / "f.txt")})).is_error
        assert approver.asked[0].directory == str(a)
        assert not (await tk.call("read", {"path": str(a / "g.txt")})).is_error  # granted dir
        assert not (await tk.call("read", {"path": str(root / "home/other/b/f.txt")})).is_error
        assert not (await tk.call("read", {"path": str(root / "home/other/b/g.txt")})).is_error
        assert len(approver.asked) == 2  # the session grant covers everything after


async def test_parallel_reads_under_one_new_directory_ask_once(root: Path) -> None:
    approver = Approver(["directory"], delay=0.2)
    async with toolkit(root, approver) as tk:
        b = root / "home" / "other" / "b"
        results = await asyncio.gather(*(tk.call("read", {"path": str(b / n)})
                                         for n in ("f.txt", "g.txt", "f.txt")))
    assert [r.output.split("\n")[0] for r in results] == ["00001| b", "00001| bg", "00001| b"]
    assert len(approver.asked) == 1


async def test_bash_token_check(root: Path) -> None:
    approver = Approver(["deny", "deny"])
    async with toolkit(root, approver) as tk:
        outside = await tk.call("bash", {"command": f"cat {root}/home/other/a/f.txt"})
        assert outside.is_error and outside.output.startswith("bash: ")
        climb = await tk.call("bash", {"command": "cat ../home/other/b/f.txt"})
        assert climb.is_error
        assert [q.path for q in approver.asked] == [str(root / "home/other/a/f.txt"),
                                                    str(root / "home/other/b/f.txt")]
        fine = await tk.call("bash", {"command": "/usr/bin/env cat in.txt /tmp/nothing 2>&1; true"})
        assert "inside" in fine.output and len(approver.asked) == 2


async def test_unrestricted_never_asks(root: Path) -> None:
    async with toolkit(root, Approver([]), scope="unrestricted") as tk:
        read = await tk.call("read", {"path": str(root / "home/other/a/f.txt")})
        assert read.output.startswith("00001| a\n")
        assert not (await tk.call("bash", {"command": f"cat {root}/home/other/b/f.txt"})).is_error


def test_user_named_paths_parsing() -> None:
    text = ("Check /srv/data/report.csv, and '/srv/my docs/plan.md' plus ~/notes. "
            "Not http://example.com/x or a/relative/path; (see /opt/x).")
    assert user_named_paths(text, "/home/me") == {
        "/srv/data/report.csv", "/srv/my docs/plan.md", "/home/me/notes", "/opt/x"}


# --- decisions on the canonical path (issue 18: bypassed in one call) ---------------------
async def test_proc_self_root_leads_where_it_leads(root: Path) -> None:
    approver = Approver(["deny", "deny"])
    target = root / "home" / "other" / "a" / "f.txt"
    async with toolkit(root, approver) as tk:
        read = await tk.call("read", {"path": f"/proc/self/root{target}"})
        bash = await tk.call("bash", {"command": f"cat /proc/self/root{target}"})
    assert read.is_error and read.metadata == {"refused": True}
    assert f"(which is {target})" in read.output
    assert bash.is_error and "a\n" not in bash.output
    assert [q.path for q in approver.asked] == [f"/proc/self/root{target}", str(target)]


async def test_bash_tokens_through_proc_and_the_commands_own_streams(root: Path) -> None:
    approver = Approver(["deny"] * 3)
    target = root / "home" / "other" / "a" / "f.txt"
    async with toolkit(root, approver) as tk:
        asked = [await tk.call("bash", {"command": f"cat /proc/1/root{target}"}),
                 await tk.call("bash", {"command": "cat /proc/self/cwd/../home/other/b/f.txt"}),
                 await tk.call("bash", {"command": f"cat /proc/thread-self/task/1/root{target}"})]
        free = await tk.call("bash", {"command": "echo out >/dev/stderr; cat /dev/stdin "
                                                 "/proc/self/status /dev/fd/0 >/dev/null; "
                                                 "echo fine >/dev/stdout"})
    assert all(r.is_error and r.metadata == {"refused": True} for r in asked)
    assert [q.path for q in approver.asked] == [str(target), str(root / "home/other/b/f.txt"),
                                                str(target)]
    assert not free.is_error and free.output.endswith("fine\n"), free.output


async def test_proc_cwd_and_fd_lead_where_they_lead(root: Path) -> None:
    # The host backend reads in this process: its cwd and its fds are what /proc/self shows.
    approver = Approver(["deny", "deny"])
    target = root / "home" / "other" / "b" / "f.txt"
    # a process whose cwd is outside the scope (not this one's: a checkout under /tmp, where
    # CI may clone, is inside the temp-dir prefix and would never be asked about)
    elsewhere = subprocess.Popen(["sleep", "60"], cwd=target.parent)
    try:
        with target.open() as held:
            async with toolkit(root, approver) as tk:
                paths = [f"/proc/self/fd/{held.fileno()}", f"/proc/{elsewhere.pid}/cwd/f.txt"]
                by_fd = await tk.call("read", {"path": paths[0]})
                by_cwd = await tk.call("read", {"path": paths[1]})
    finally:
        elsewhere.kill()
        elsewhere.wait()
    assert by_fd.is_error and f"(which is {target})" in by_fd.output
    assert by_cwd.is_error and f"(which is {target})" in by_cwd.output
    assert [q.path for q in approver.asked] == paths


async def test_a_symlink_bash_made_in_the_base_dir_to_an_ordinary_file_is_in_scope(
        root: Path) -> None:
    """Seed 003: lexical or canonical containment both count — a path written below the base
    dir is in scope wherever its symlinks lead, unless it leads to a secret of the machine."""
    approver = Approver(["deny", "deny"])
    async with toolkit(root, approver) as tk:
        # no absolute path in the command: the bash token check has nothing to see
        made = await tk.call("bash", {"command": "ln -s \"$(dirname \"$PWD\")/home/other\" o && "
                                                 "ln -s o/a/f.txt f && "
                                                 "ln -s \"$(printf /etc/sh%sow ad)\" s && echo made"})
        assert made.output == "made\n" and approver.asked == []
        results = [await tk.call("read", {"path": "f"}),
                   await tk.call("grep", {"pattern": ".", "path": "o/a"}),
                   await tk.call("read", {"path": str(root / "work" / "o" / "b" / "g.txt")})]
        secret = await tk.call("read", {"path": "s"})
        outside = await tk.call("read", {"path": str(root / "home/other/a/f.txt")})
    assert [r.is_error for r in results] == [False, False, False], results
    assert results[0].output.startswith("00001| a\n")
    assert secret.is_error and secret.metadata == {"refused": True}
    assert outside.is_error and outside.metadata == {"refused": True}  # written outside: asks
    assert [q.path for q in approver.asked] == [str(root / "work/s"),
                                               str(root / "home/other/a/f.txt")]


async def test_a_symlink_into_the_base_dir_is_inside(root: Path) -> None:
    (root / "home" / "me" / "to-work").symlink_to(root / "work")
    async with toolkit(root, Approver([])) as tk:
        result = await tk.call("read", {"path": str(root / "home/me/to-work/in.txt")})
    assert result.output.startswith("00001| inside\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="reads what only root can read")
async def test_system_secrets_ask_like_any_outside_path(root: Path) -> None:
    key = next(Path("/etc/ssh").glob("ssh_host_*_key"), None)
    private = Path("/opt") / f"toolseam-test-{uuid.uuid4().hex[:8]}"
    private.mkdir()
    (private / "token").write_text("t0ken\n")
    (private / "token").chmod(0o600)
    (private / "public").write_text("public\n")
    (private / "public").chmod(0o644)
    try:
        approver = Approver(["deny"] * 7)
        async with toolkit(root, approver) as tk:
            asked = [await tk.call("read", {"path": "/etc/shadow"}),
                     await tk.call("read", {"path": "/etc/gshadow"}),
                     await tk.call("read", {"path": str(key or "/etc/sudoers")}),
                     await tk.call("grep", {"pattern": "root", "path": "/etc"}),
                     await tk.call("bash", {"command": "cat /etc/shadow"}),
                     await tk.call("read", {"path": str(private / "token")}),
                     await tk.call("read", {"path": "/proc/self/environ"})]
            free = [await tk.call("read", {"path": "/etc/hostname"}),
                    await tk.call("read", {"path": str(private / "public")}),
                    await tk.call("glob", {"pattern": "shadow*", "path": "/etc"}),
                    await tk.call("grep", {"pattern": "x", "path": "/usr/share/base-files"})]
    finally:
        shutil.rmtree(private)
    assert all(r.is_error and r.metadata == {"refused": True} for r in asked), \
        [r.output for r in asked]
    assert "read: /etc/shadow holds secrets of this system and reading it" in asked[0].output
    assert "t0ken" not in asked[5].output and ":0:" not in asked[4].output
    assert len(approver.asked) == 7
    assert not any(r.is_error for r in free), [r.output for r in free]


async def test_a_user_named_secret_is_read_without_asking(root: Path) -> None:
    async with toolkit(root, Approver([])) as tk:
        tk.user_message("what is in /etc/gshadow?")
        assert not (await tk.call("read", {"path": "/etc/gshadow"})).is_error


@pytest.mark.parametrize("engine", ["podman"])
async def test_a_container_backend_decides_on_the_canonical_path(engine: str) -> None:
    """The read scope sits above the seam: the sandbox resolves, the policy decides."""
    from ..support import engines

    workspace = engines.shared_dir()
    approver = Approver(["deny"] * 3)
    try:
        async with Toolkit(engines.backend(engine, str(workspace)), approver=approver,  # type: ignore[arg-type]
                           settings=Settings(read_scope="working-dir")) as tk:
            made = await tk.call("bash", {"command": "ln -s \"$(printf /var/lib/dpkg)\" o && "
                                                     "ln -s \"$(printf /etc/shadow)\" s"})
            assert not made.is_error, made.output
            through_link = await tk.call("read", {"path": "o/status"})  # lexically inside
            results = [await tk.call("read", {"path": "s"}),
                       await tk.call("read", {"path": "/proc/self/root/var/lib/dpkg/status"}),
                       await tk.call("grep", {"pattern": "root", "path": "/proc/self/root/etc"})]
            inside = await tk.call("read", {"path": "/etc/hostname"})
    finally:
        engines.remove_shared(workspace)
    assert all(r.is_error and r.metadata == {"refused": True} for r in results), \
        [r.output for r in results]
    assert [q.directory for q in approver.asked] == ["/etc", "/var/lib/dpkg", "/etc"]
    assert not inside.is_error, inside.output
    assert not through_link.is_error, through_link.output  # seed 003: lexical containment


_part = st.text(alphabet="abcxyz.-_", min_size=1, max_size=6).filter(lambda p: p not in (".", ".."))


@given(parts=st.lists(_part, min_size=1, max_size=5), data=st.data())
def test_any_proc_spelling_of_a_bash_path_is_checked_as_that_path(parts: list[str],
                                                                  data: st.DataObject) -> None:
    """However /proc/*/root, doubled slashes and `x/..` detours are stacked around a path, the
    bash check sees the path itself."""
    plain = "/" + "/".join(parts)
    spelled = plain
    for _ in range(data.draw(st.integers(0, 3))):
        proc = data.draw(st.sampled_from(["self", "1", "thread-self", "42/task/42"]))
        detour = data.draw(st.sampled_from(["", "/", "/zz/..", "/.", "/../.."]))
        spelled = f"/proc/{proc}/root{detour}{spelled}"
    if data.draw(st.booleans()):
        spelled = "/" + spelled  # normpath keeps two leading slashes
    assert _without_proc_links(spelled, "/w") == plain
