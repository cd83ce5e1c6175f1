"""Read scope (CONTRACT §8): what asks, what never asks, and how each answer behaves."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

from toolseam import ReadQuestion, Settings, Toolkit
from toolseam.policy.readscope import user_named_paths

from .conftest import scratch_root


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
