"""Enumerate a tree for glob and grep: the FULL candidate set, in whatever order the disk gives.

This module never sorts and never caps — ordering and truncation are the library's job
(``toolseam.listing``), so no backend can change which results the model sees.

The walk rule: regular files only; symlinks neither followed nor listed; directories named
``.git`` and ``node_modules`` pruned at any depth; hidden files included; unreadable
directories skipped and counted. The walk is fd-relative (``O_NOFOLLOW`` per directory), so a
directory swapped for a symlink mid-walk is skipped, never followed out of the tree, and at most
one fd per level is open.
"""

from __future__ import annotations

import io
import os
import re
import stat
from collections.abc import Generator
from typing import Any

from .errors import NOT_REGULAR, FsError
from .files import bounded_lines, decode_line, read_whole
from .names import escape_name
from .paths import open_path, resolve

PRUNED_DIRS = frozenset({".git", "node_modules"})
_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
# Patterns whose meaning differs between one line and a whole text; they skip the prefilter.
_LINE_ONLY_SYNTAX = re.compile(r"\\[AZz]|\(\?")
_GREP_STEP = 256  # files read between two points where a host event loop may step in
_FIRST_READ = 1 << 14  # most source files fit; a bigger buffer costs its allocation per file


# Memory bounds of a search, whatever the files' shapes: files above WHOLE_READ_MAX are read
# line by line (files.bounded_lines), a line is searched in at most its first LINE_BYTES_CAP
# bytes, and a hit keeps at most HIT_TEXT_CAP characters of its line.
WHOLE_READ_MAX = 8 << 20
LINE_BYTES_CAP = 1 << 20
HIT_TEXT_CAP = 4096


def _walk(root_fd: int, unreadable: list[int]
          ) -> Generator[tuple[int, str, list[os.DirEntry[str]]], None, None]:
    """Depth-first over an open directory fd: (dir fd, rel prefix, regular-file entries) per
    directory, the fd valid while the tuple is being used. Unreadable dirs are counted."""
    frames: list[tuple[int, str, list[str]]] = []

    def scan(fd: int) -> tuple[list[str], list[os.DirEntry[str]]]:
        subdirs: list[str] = []
        found: list[os.DirEntry[str]] = []
        with os.scandir(fd) as entries:
            for entry in entries:  # files first: they are most entries, one test each
                if entry.is_file(follow_symlinks=False):
                    found.append(entry)
                elif entry.is_dir(follow_symlinks=False) and entry.name not in PRUNED_DIRS:
                    subdirs.append(entry.name)
        return subdirs, found

    fd, prefix = root_fd, ""
    try:
        while True:
            try:
                subdirs, found = scan(fd)
            except OSError:
                os.close(fd)
                unreadable[0] += 1
            else:
                frames.append((fd, prefix, subdirs))
                yield fd, prefix, found
            fd = -1
            while frames and fd < 0:
                parent, parent_prefix, pending = frames[-1]
                if not pending:
                    os.close(parent)
                    frames.pop()
                    continue
                name = pending.pop()
                try:
                    fd = os.open(name, _DIR_OPEN, dir_fd=parent)
                except OSError:
                    unreadable[0] += 1
                    continue
                prefix = parent_prefix + escape_name(name) + "/"
            if fd < 0:
                return
    finally:  # stopped early (a cancelled call): every directory still held is closed
        for held, _, _ in frames:
            os.close(held)
        frames.clear()


def _open_root(base: str, path: str, confine: bool) -> tuple[int, bool, str]:
    """Open the search root; returns (fd, is_dir, leaf name). A file root is one file."""
    r = resolve(base, path, confine)
    fd = open_path(r, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        return fd, True, ""
    if stat.S_ISREG(mode):
        return fd, False, r.parts[-1] if r.parts else path
    os.close(fd)
    raise FsError(NOT_REGULAR, path)


Steps = Generator[None, None, dict[str, Any]]


def run_to_end(steps: Steps) -> dict[str, Any]:
    """A stepwise walk's result in one go (the agent runs it on a worker thread)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return dict(done.value)


def list_files(base: str, path: str, confine: bool, match: str | None = None,
               match_basename: bool = False, name_suffix: str | None = None) -> dict[str, Any]:
    """``list_files_steps`` run to its end."""
    return run_to_end(list_files_steps(base, path, confine, match, match_basename, name_suffix))


def grep_files(base: str, path: str, confine: bool, pattern: str, include: str | None = None,
               include_basename: bool = True) -> dict[str, Any]:
    """``grep_steps`` run to its end."""
    return run_to_end(grep_steps(base, path, confine, pattern, include, include_basename))


def list_files_steps(base: str, path: str, confine: bool, match: str | None = None,
                     match_basename: bool = False, name_suffix: str | None = None) -> Steps:
    """Every regular file under ``path`` whose rel path (or basename) fully matches ``match``.

    ``name_suffix``, when given, is an exact shortcut for ``match``: a file name matches iff it
    ends with it (the library sends it for patterns like ``*.py`` / ``**/*.py``). A generator:
    it yields after each directory, so a host event loop can interleave it with other work
    (``toolseam.backends._parts``); closing it early closes every directory it holds.
    """
    matcher = re.compile(match).fullmatch if match is not None else None
    paths: list[str] = []
    fd, is_dir, leaf = _open_root(base, path, confine)
    if not is_dir:
        rel = escape_name(leaf)
        os.close(fd)
        if matcher is None or matcher(rel):
            paths.append(rel)
        return {"paths": paths, "unreadable_dirs": 0}
    unreadable = [0]
    add_path = paths.append  # the loop runs once per file
    walker = _walk(fd, unreadable)
    try:
        for _, prefix, found in walker:
            for entry in found:
                name = entry.name
                if name_suffix is not None:
                    if not name.endswith(name_suffix):
                        continue
                elif matcher is not None and not matcher(
                        escape_name(name) if match_basename else prefix + escape_name(name)):
                    continue
                add_path(prefix + name if name.isascii() else prefix + escape_name(name))
            yield
    finally:
        walker.close()  # also when stopped early: every directory it holds is closed
    return {"paths": paths, "unreadable_dirs": unreadable[0]}


def grep_steps(base: str, path: str, confine: bool, pattern: str, include: str | None = None,
               include_basename: bool = True) -> Steps:
    """Every line matching ``pattern`` (Python ``re``) in every UTF-8 file under ``path``.

    Lines are those of the text after universal-newline decoding, numbered from 1. A file that
    is not UTF-8 is skipped and counted. Each hit is ``[rel, line_number, text]``. A
    generator like ``list_files_steps``: it yields after each directory and every
    ``_GREP_STEP`` files.
    """
    regex = re.compile(pattern)
    # A whole-file search first: most files have no hit, and one search beats a split per line.
    prefilter = None if _LINE_ONLY_SYNTAX.search(pattern) else re.compile(pattern, re.MULTILINE)
    includer = re.compile(include).fullmatch if include is not None else None
    hits: list[tuple[str, int, str]] = []

    def text_of(data: bytes) -> str | None:
        """The file's text with universal newlines, or None when it is not UTF-8."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        return text

    def add_hits(text: str, rel: str) -> None:
        for number, line in enumerate(text.split("\n"), 1):
            if regex.search(line):
                hits.append((rel, number, line[:HIT_TEXT_CAP]))

    def stream_hits(file_fd: int, rel: str) -> bool:
        """A big file line by line, from its start (a longer line is searched in its first
        ``LINE_BYTES_CAP`` bytes). False when it is not UTF-8."""
        found: list[tuple[str, int, str]] = []
        os.lseek(file_fd, 0, os.SEEK_SET)
        with io.BufferedReader(io.FileIO(file_fd, "r", closefd=False), 1 << 16) as reader:
            for number, (raw, was_cut) in enumerate(bounded_lines(reader, LINE_BYTES_CAP), 1):
                try:
                    line = decode_line(raw, was_cut, rel)
                except FsError:
                    return False
                if regex.search(line):
                    found.append((rel, number, line[:HIT_TEXT_CAP]))
        hits.extend(found)
        return True

    fd, is_dir, leaf = _open_root(base, path, confine)
    if not is_dir:
        try:
            head = os.read(fd, _FIRST_READ)
            if b"\0" in head:
                text = None
            elif os.fstat(fd).st_size > WHOLE_READ_MAX:
                streamed = stream_hits(fd, escape_name(leaf))
                return {"hits": hits, "binary_files": int(not streamed), "unreadable_files": 0,
                        "unreadable_dirs": 0}
            else:
                text = text_of(head + read_whole(fd) if len(head) == _FIRST_READ else head)
        finally:
            os.close(fd)
        if text is not None and (prefilter is None or prefilter.search(text) is not None):
            add_hits(text, escape_name(leaf))
        return {"hits": hits, "binary_files": int(text is None), "unreadable_files": 0,
                "unreadable_dirs": 0}
    unreadable, skipped = [0], {"binary": 0, "unreadable": 0}

    def search_files(dir_fd: int, prefix: str, entries: list[os.DirEntry[str]]) -> None:
        # The hot loop of a search over thousands of files: a file without a hit costs an
        # open, one read, a close, a decode and one C-level search — names are escaped only
        # for hits.
        open_, read, close = os.open, os.read, os.close
        for entry in entries:
            name = entry.name
            if includer is not None and not includer(
                    escape_name(name) if include_basename else prefix + escape_name(name)):
                continue
            try:
                file_fd = open_(name, _FILE_OPEN, dir_fd=dir_fd)
            except OSError:
                skipped["unreadable"] += 1
                continue
            try:
                data = read(file_fd, _FIRST_READ)
                if len(data) == _FIRST_READ:
                    if b"\0" in data:  # binary, known without reading the rest
                        skipped["binary"] += 1
                        continue
                    if os.fstat(file_fd).st_size > WHOLE_READ_MAX:
                        if not stream_hits(file_fd, prefix + escape_name(name)):
                            skipped["binary"] += 1
                        continue
                    data += read_whole(file_fd)
            finally:
                close(file_fd)
            text = text_of(data)
            if text is None:
                skipped["binary"] += 1
            elif prefilter is None or prefilter.search(text) is not None:
                add_hits(text, prefix + escape_name(name))

    walker = _walk(fd, unreadable)
    try:
        for dir_fd, prefix, found in walker:
            for first in range(0, len(found) or 1, _GREP_STEP):  # a yield per dir, even empty
                search_files(dir_fd, prefix, found[first:first + _GREP_STEP])
                yield
    finally:
        walker.close()  # also when stopped early: every directory it holds is closed
    return {"hits": hits, "binary_files": skipped["binary"],
            "unreadable_files": skipped["unreadable"], "unreadable_dirs": unreadable[0]}
