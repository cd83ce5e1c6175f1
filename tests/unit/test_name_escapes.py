"""A name a listing shows is a usable path, for any bytes a Linux file name may hold."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam_agent import files, walk

# Any byte but "/" and NUL; "." and ".." are not names of files.
names = st.binary(min_size=1, max_size=24).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b".."))


@settings(max_examples=300, deadline=None)
@given(name=names, content=st.binary(max_size=64).filter(lambda b: b"\0" not in b[:8192]))
def test_a_listed_name_reads_back_its_file(name: bytes, content: bytes) -> None:
    root = tempfile.mkdtemp()
    try:
        with open(os.path.join(os.fsencode(root), name), "wb") as f:
            f.write(content)
        (shown,) = walk.list_files(root, ".", True)["paths"]
        shown.encode("utf-8")  # no lone surrogate: the shown form crosses JSON and a context
        got = files.read_bytes(root, shown, True)["data"]
        assert got == content
    finally:
        shutil.rmtree(root)


@settings(max_examples=100, deadline=None)
@given(name=names)
def test_a_literal_backslash_name_wins_over_its_escaped_reading(name: bytes) -> None:
    """Both exist: the literal text names the literal file."""
    root = os.fsencode(tempfile.mkdtemp())
    try:
        shown = walk.escape_name(os.fsdecode(name))
        literal = shown.encode("utf-8")
        if literal == name or b"/" in literal:
            return
        for path, data in ((name, b"escaped"), (literal, b"literal")):
            with open(os.path.join(root, path), "wb") as f:
                f.write(data)
        assert files.read_bytes(os.fsdecode(root), shown, True)["data"] == b"literal"
    finally:
        shutil.rmtree(root)
