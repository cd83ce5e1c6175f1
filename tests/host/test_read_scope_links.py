"""Read scope decides on the file, not just its name (issue 32, attack 5; seed 003's rule).

A hard link a command makes in the base dir to ``/etc/shadow`` is ``/etc/shadow``: it asks like
the file itself. Every spelling of a protected file asks — symlink chains in the base dir, ``..``
climbs, doubled slashes, ``/proc/self/root`` — while a symlink in the base dir to an ordinary
file elsewhere is in scope (lexical or canonical containment both count)."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolseam import ReadQuestion, Settings, Toolkit

from ..support.processes import scratch_root

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="links and reads what only root can read")


@pytest.fixture
def base() -> Iterator[Path]:
    # not under /tmp: the temp dirs are always in scope; on /etc's filesystem, for hard links
    root = scratch_root() / uuid.uuid4().hex[:8]
    (root / "work").mkdir(parents=True)
    (root / "elsewhere").mkdir()
    (root / "elsewhere" / "plain.txt").write_text("plain\n")
    yield root
    shutil.rmtree(root)


class Asked:
    def __init__(self) -> None:
        self.paths: list[str] = []

    def __call__(self, question: ReadQuestion) -> str:
        self.paths.append(question.path)
        return "deny"


def _toolkit(root: Path, asked: Asked) -> Toolkit:
    return Toolkit("host", base_dir=str(root / "work"), settings=Settings(read_scope="working-dir"),
                   approver=asked)


@as_root
async def test_a_hard_link_to_shadow_made_by_a_command_asks_like_shadow(base: Path) -> None:
    asked = Asked()
    async with _toolkit(base, asked) as tk:
        made = await tk.call("bash", {"command": 'here=$PWD; cd /etc && ln shadow "$here/hl" && '
                                                 'ln hostname "$here/hn" && echo made'})
        assert made.output == "made\n", made.output
        assert os.stat(base / "work" / "hl").st_ino == os.stat("/etc/shadow").st_ino
        read = await tk.call("read", {"path": "hl"})
        grep = await tk.call("grep", {"pattern": "root", "path": "hl"})
        ordinary = await tk.call("read", {"path": "hn"})  # a world-readable file: no secret
    assert read.is_error and read.metadata == {"refused": True}
    assert "hard link" in read.output and "root:" not in read.output
    assert grep.is_error and "root:" not in grep.output
    assert not ordinary.is_error and ordinary.output.startswith("00001| ")
    assert asked.paths == [str(base / "work" / "hl")] * 2


@as_root
async def test_a_hard_link_to_any_private_system_file_asks(base: Path) -> None:
    """Not only the named secrets: a multi-link file that is not world-readable on the
    system's own filesystem might be one — a key a package made 0600 under /etc."""
    private = Path("/etc") / f"toolseam-test-{uuid.uuid4().hex[:8]}.key"
    private.write_text("k3y\n")
    private.chmod(0o600)
    try:
        os.link(private, base / "work" / "k")
        asked = Asked()
        async with _toolkit(base, asked) as tk:
            read = await tk.call("read", {"path": "k"})
        assert read.is_error and "k3y" not in read.output
        assert asked.paths == [str(base / "work" / "k")]
    finally:
        private.unlink()


def _spell(root: Path, target: str, form: str, depth: int) -> str:
    """Make (in the base dir) and return a spelling of ``target`` of the given form."""
    work = root / "work"
    if form == "symlink-chain":
        previous = target
        for i in range(depth):
            link = work / f"l{i}-{uuid.uuid4().hex[:6]}"
            link.symlink_to(previous)
            previous = str(link)
        return os.path.relpath(previous, work)
    if form == "dotdot":
        return "../" * (len(work.parts) + depth - 1) + target.lstrip("/")
    if form == "double-slash":
        return "/" + "//".join(target.split("/"))
    return "/proc/self/root" + target  # form == "proc-root"


FORMS = st.sampled_from(["symlink-chain", "dotdot", "double-slash", "proc-root"])


@as_root
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(form=FORMS, depth=st.integers(1, 4))
def test_every_spelling_of_a_protected_file_asks(base: Path, form: str, depth: int) -> None:
    asked = Asked()
    spelt = _spell(base, "/etc/shadow", form, depth)

    async def read() -> None:
        async with _toolkit(base, asked) as tk:
            result = await tk.call("read", {"path": spelt})
            assert result.is_error and "root:" not in result.output
    asyncio.run(read())
    assert len(asked.paths) == 1


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(depth=st.integers(1, 4), written_inside=st.booleans())
def test_an_ordinary_file_elsewhere_is_in_scope_when_written_inside(
        base: Path, depth: int, written_inside: bool) -> None:
    """Through a symlink chain made in the base dir: in scope (lexical containment). Written
    as its own path outside: asks."""
    asked = Asked()
    target = str(base / "elsewhere" / "plain.txt")
    spelt = _spell(base, target, "symlink-chain", depth) if written_inside else target

    async def read() -> None:
        async with _toolkit(base, asked) as tk:
            result = await tk.call("read", {"path": spelt})
            assert result.is_error is not written_inside
            if written_inside:
                assert result.output.startswith("00001| plain")
    asyncio.run(read())
    assert asked.paths == ([] if written_inside else [target])
