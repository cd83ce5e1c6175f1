"""``read_private_text`` (the token files of ``toolseam mcp`` and ``toolseam metrics``) checks
the file it reads, not a path: a symlink is refused, and a file swapped in after the check is
never the one read (issue 47)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolseam.backends.staging import read_private_text
from toolseam.seam.errors import ConfigurationError

SECRET = "s" * 40


def private_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_an_owner_only_file_is_read(tmp_path: Path) -> None:
    assert read_private_text(str(private_file(tmp_path / "token", SECRET)), "--x") == SECRET


def test_a_symlink_to_another_file_is_refused(tmp_path: Path) -> None:
    target = private_file(tmp_path / "elsewhere", SECRET)
    (tmp_path / "token").symlink_to(target)
    with pytest.raises(ConfigurationError, match=r"^--token-file: is a symlink"):
        read_private_text(str(tmp_path / "token"), "--token-file")


@pytest.mark.parametrize("what", ["a directory", "a fifo"])
def test_what_is_not_a_regular_file_is_refused_without_waiting(tmp_path: Path, what: str) -> None:
    path = tmp_path / "token"
    if what == "a directory":
        path.mkdir(mode=0o700)
    else:
        os.mkfifo(path, 0o600)  # no writer: a blocking open would wait for ever
    with pytest.raises(ConfigurationError, match="--x: "):
        read_private_text(str(path), "--x")


def test_a_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"other users can read or change it.*chmod 600"):
        read_private_text(str(private_file(tmp_path / "token", SECRET, 0o644)), "--x")


def test_a_file_swapped_after_the_check_is_not_the_one_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The moment between the check and the read, played: as soon as the owner's file has been
    checked, another file (readable by anyone, other words) is renamed over its name."""
    path = private_file(tmp_path / "token", SECRET)
    planted = private_file(tmp_path / "planted", "planted by someone else", 0o666)
    real_stat, real_fstat = os.stat, os.fstat
    swapped: list[bool] = []

    def swap_after(check):  # type: ignore[no-untyped-def]
        def checked(*args, **kwargs):  # type: ignore[no-untyped-def]
            found = check(*args, **kwargs)
            if not swapped:
                swapped.append(True)
                os.rename(planted, path)
            return found
        return checked

    monkeypatch.setattr(os, "stat", swap_after(real_stat))
    monkeypatch.setattr(os, "fstat", swap_after(real_fstat))
    text = read_private_text(str(path), "--x")
    assert swapped, "the check was never made"
    assert text == SECRET
