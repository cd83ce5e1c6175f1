"""apply_patch: the grammar, all-or-nothing commits, confinement of every path."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from toolseam import Toolkit
from toolseam_agent import files as agent_files


def patch(*body: str) -> dict[str, str]:
    return {"patchText": "\n".join(["*** Begin Patch", *body, "*** End Patch"])}


@pytest_asyncio.fixture
async def tk(tmp_path: Path) -> AsyncIterator[Toolkit]:
    async with Toolkit("host", base_dir=str(tmp_path), confine_to_base_dir=True) as toolkit:
        yield toolkit


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


async def test_add_update_delete_move(tk: Toolkit, tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("a\nb\nc\n")
    (tmp_path / "gone.txt").write_text("bye\n")
    result = await tk.call("apply_patch", patch(
        "*** Add File: new/n.txt", "+hello", "+world",
        "*** Update File: old.txt", "*** Move to: moved/old.txt", "@@", " a", "-b", "+B", " c",
        "*** Delete File: gone.txt"))
    assert result.output == "Applied patch: 3 file operations"
    assert result.metadata == {"added": 1, "updated": 1, "deleted": 1, "moved": 1}
    assert tree(tmp_path) == {"moved/old.txt": b"a\nB\nc\n", "new/n.txt": b"hello\nworld\n"}


async def test_two_sections_for_one_file_apply_in_order(tk: Toolkit, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("1\n2\n3\n")
    result = await tk.call("apply_patch", patch(
        "*** Update File: f.txt", "-1", "+one",
        "*** Update File: f.txt", "-one", "+ONE"))
    assert not result.is_error, result.output
    assert (tmp_path / "f.txt").read_text() == "ONE\n2\n3\n"
    single = await tk.call("apply_patch", patch("*** Update File: f.txt", "-3", "+three"))
    assert single.output == "Applied patch: 1 file operation"


async def test_end_of_file_anchor_and_crlf_preserved(tk: Toolkit, tmp_path: Path) -> None:
    (tmp_path / "w.txt").write_bytes(b"x\r\ny\r\nx\r\n")
    result = await tk.call("apply_patch", patch("*** Update File: w.txt", "@@", "-x", "+z",
                                                "*** End of File"))
    assert not result.is_error, result.output
    assert (tmp_path / "w.txt").read_bytes() == b"x\r\ny\r\nz\r\n"


async def test_failing_hunk_changes_nothing(tk: Toolkit, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "b.txt").write_text("b\n")
    before = tree(tmp_path)
    result = await tk.call("apply_patch", patch(
        "*** Update File: a.txt", "-a", "+A", "*** Add File: c.txt", "+c",
        "*** Update File: b.txt", "-not there", "+x"))
    assert result.is_error
    assert result.output.startswith("apply_patch: b.txt: hunk 1 does not match the file")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("body", [
    ("*** Add File: ../escape.txt", "+x"),
    ("*** Update File: a.txt", "*** Move to: ../escape.txt", "-a", "+A"),
    ("*** Delete File: /etc/hostname",),
])
async def test_every_path_obeys_confinement(tk: Toolkit, tmp_path: Path, body: tuple[str, ...]) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    before = tree(tmp_path)
    result = await tk.call("apply_patch", patch(*body))
    assert result.is_error and "resolves outside baseDir" in result.output
    assert tree(tmp_path) == before
    assert not (tmp_path.parent / "escape.txt").exists()


async def test_os_failure_on_second_of_three_files_rolls_back(
        tk: Toolkit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "one.txt").write_text("1\n")
    (tmp_path / "two.txt").write_text("2\n")
    (tmp_path / "three.txt").write_text("3\n")
    before = tree(tmp_path)
    real_rename = os.rename
    installs: list[str] = []

    def flaky_rename(src: str, dst: str, **kw: int) -> None:
        if src.endswith(".tmp"):
            installs.append(dst)
            if len(installs) == 2:
                raise OSError(28, "No space left on device", dst)
        real_rename(src, dst, **kw)

    monkeypatch.setattr(agent_files, "_rename", flaky_rename)
    result = await tk.call("apply_patch", patch(
        "*** Update File: one.txt", "-1", "+ONE",
        "*** Update File: two.txt", "-2", "+TWO",
        "*** Add File: sub/three-new.txt", "+new",
        "*** Delete File: three.txt"))
    assert installs[:2] == ["one.txt", "two.txt"]
    assert result.is_error and "No space left on device" in result.output
    assert tree(tmp_path) == before  # byte-identical, no temp or backup files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.txt", "three.txt", "two.txt"]


@pytest.mark.parametrize(("text", "message"), [
    ("nothing", "apply_patch: the patch must start with '*** Begin Patch'"),
    ("*** Begin Patch\n*** Frobnicate: x\n*** End Patch", "apply_patch: line 2: expected"),
    ("*** Begin Patch\n*** Add File: x\nno plus\n*** End Patch", "apply_patch: Add File: x: every line"),
    ("*** Begin Patch\n*** Add File: x\n+x", "apply_patch: the patch must end with '*** End Patch'"),
])
async def test_malformed_patches_are_named(tk: Toolkit, text: str, message: str) -> None:
    result = await tk.call("apply_patch", {"patchText": text})
    assert result.is_error and result.output.startswith(message)


async def test_add_over_existing_replaces_and_update_missing_is_refused(tk: Toolkit, tmp_path: Path) -> None:
    (tmp_path / "here.txt").write_text("x\n")
    exists = await tk.call("apply_patch", patch("*** Add File: here.txt", "+y"))
    assert not exists.is_error and (tmp_path / "here.txt").read_text() == "y\n"
    missing = await tk.call("apply_patch", patch("*** Update File: nope.txt", "-a", "+b"))
    assert missing.output == "apply_patch: Update File: nope.txt does not exist"


BODY = "*** Begin Patch\n*** Update File: f.txt\n@@\n-a\n+b\n*** End Patch"


@pytest.mark.parametrize("wrapped", [
    f"apply_patch <<'EOF'\n{BODY}\nEOF\n",
    f'apply_patch <<"EOF"\n{BODY}\nEOF',
    f"cat <<EOF\n{BODY}\nEOF\n",
    f"<<PATCH\n{BODY}\nPATCH\n\n",
    "\n  *** Begin Patch  \n *** Update File: f.txt\n@@\n-a\n+b\n\n*** End Patch \n",
])
async def test_heredoc_wrappers_and_padded_markers(tk: Toolkit, tmp_path: Path, wrapped: str) -> None:
    (tmp_path / "f.txt").write_text("a\n")
    result = await tk.call("apply_patch", {"patchText": wrapped})
    assert not result.is_error, result.output
    assert (tmp_path / "f.txt").read_text() == "b\n"


async def test_unmatched_heredoc_delimiter_is_not_unwrapped(tk: Toolkit) -> None:
    result = await tk.call("apply_patch", {"patchText": f"cat <<EOF\n{BODY}\nEND\n"})
    assert result.output == "apply_patch: the patch must start with '*** Begin Patch'"


async def test_fuzzy_matching_ladder(tk: Toolkit, tmp_path: Path) -> None:
    (tmp_path / "f.py").write_text("x = 1   \n    y = \u201cq\u201d \u2014 \u2018a\u2019\u00a0z\nend\n")
    result = await tk.call("apply_patch", patch(
        "*** Update File: f.py", "@@", "-x = 1", "+x = 2", "-y = \"q\" - 'a' z", "+y = 3", " end"))
    assert not result.is_error, result.output
    assert (tmp_path / "f.py").read_text() == "x = 2\ny = 3\nend\n"


async def test_first_last_line_and_bare_addition(tk: Toolkit, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("first\nmiddle\nlast")  # no final newline
    result = await tk.call("apply_patch", patch(
        "*** Update File: f.txt", "@@", "-first", "+FIRST", "@@", "-last", "+LAST",
        "*** End of File", "", "@@", "+appended"))
    assert not result.is_error, result.output
    assert (tmp_path / "f.txt").read_text() == "FIRST\nmiddle\nLAST\nappended\n"


@pytest.mark.parametrize(("body", "message"), [
    (("*** Update File: f.txt", "@@"), "apply_patch: Update File: f.txt: hunk 1 ('@@') has no lines"),
    (("*** Update File: f.txt", "@@ a"), "apply_patch: Update File: f.txt: hunk 1 ('@@') has no lines"),
    (("*** Update File: f.txt", "@@", "*** End of File"),
     "apply_patch: Update File: f.txt: line 4: '*** End of File' ends a hunk that has no lines"),
    (("*** Update File: f.txt",), "apply_patch: Update File: f.txt has no hunks"),
])
async def test_empty_hunks_stay_errors(tk: Toolkit, tmp_path: Path, body: tuple[str, ...],
                                       message: str) -> None:
    (tmp_path / "f.txt").write_text("a\n")
    result = await tk.call("apply_patch", patch(*body))
    assert result.output == message
    assert (tmp_path / "f.txt").read_text() == "a\n"


async def test_move_over_existing_replaces_it(tk: Toolkit, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "b.txt").write_text("old b\n")
    result = await tk.call("apply_patch", patch("*** Update File: a.txt", "*** Move to: b.txt",
                                                "@@", "-a", "+A"))
    assert not result.is_error, result.output
    assert tree(tmp_path) == {"b.txt": b"A\n"}
