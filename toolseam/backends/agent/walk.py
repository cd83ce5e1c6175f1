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

import os
import re
import stat
from collections.abc import Callable
from typing import Any

from .errors import NOT_REGULAR, FsError
from .paths import open_path, resolve

PRUNED_DIRS = frozenset({".git", "node_modules"})
_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
# Patterns whose meaning differs between one line and a whole text; they skip the prefilter.
_LINE_ONLY_SYNTAX = re.compile(r"\\[AZz]|\(\?")


def escape_name(name: str) -> str:
    r"""The one display form of a file name: undecodable bytes become ``\xNN``.

    ``os.scandir`` hands back names with undecodable bytes as lone surrogates
    (``surrogateescape``); those can cross neither JSON strictly nor a model's context.
    """
    if name.isascii():
        return name
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return "".join(f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else c
                       for c in name)


# on_file(dir_fd, raw_name, rel, inode) is called for every regular file in the tree
_OnFile = Callable[[int, str, str, int], None]


def _walk(root_fd: int, on_file: _OnFile) -> int:
    """Depth-first over an open directory fd; returns how many directories were unreadable."""
    unreadable = 0
    frames: list[tuple[int, str, list[str]]] = []

    def scan(fd: int, prefix: str) -> list[str]:
        subdirs: list[str] = []
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in PRUNED_DIRS:
                        subdirs.append(entry.name)
                elif entry.is_file(follow_symlinks=False):
                    on_file(fd, entry.name, prefix + escape_name(entry.name), entry.inode())
        return subdirs

    try:
        frames.append((root_fd, "", scan(root_fd, "")))
    except OSError:
        os.close(root_fd)
        return 1
    while frames:
        fd, prefix, subdirs = frames[-1]
        if not subdirs:
            os.close(fd)
            frames.pop()
            continue
        name = subdirs.pop()
        try:
            sub = os.open(name, _DIR_OPEN, dir_fd=fd)
        except OSError:
            unreadable += 1
            continue
        sub_prefix = prefix + escape_name(name) + "/"
        try:
            frames.append((sub, sub_prefix, scan(sub, sub_prefix)))
        except OSError:
            os.close(sub)
            unreadable += 1
    return unreadable


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


def list_files(base: str, path: str, confine: bool, match: str | None = None,
               match_basename: bool = False) -> dict[str, Any]:
    """Every regular file under ``path`` whose rel path (or basename) fully matches ``match``."""
    matcher = re.compile(match).fullmatch if match is not None else None
    paths: list[str] = []
    inodes: list[int] = []

    def on_file(_dir_fd: int, _raw: str, rel: str, inode: int) -> None:
        subject = rel.rpartition("/")[2] if match_basename else rel
        if matcher is None or matcher(subject):
            paths.append(rel)
            inodes.append(inode)

    fd, is_dir, leaf = _open_root(base, path, confine)
    unreadable = 0
    if is_dir:
        unreadable = _walk(fd, on_file)
    else:
        on_file(-1, leaf, escape_name(leaf), os.fstat(fd).st_ino)
        os.close(fd)
    return {"paths": paths, "inodes": inodes, "unreadable_dirs": unreadable}


def grep_files(base: str, path: str, confine: bool, pattern: str, include: str | None = None,
               include_basename: bool = True) -> dict[str, Any]:
    """Every line matching ``pattern`` (Python ``re``) in every UTF-8 file under ``path``.

    Lines are those of the text after universal-newline decoding, numbered from 1. A file that
    is not UTF-8 is skipped and counted. Each hit is ``[rel, line_number, text, inode]``.
    """
    regex = re.compile(pattern)
    # A whole-file search first: most files have no hit, and one search beats a split per line.
    prefilter = None if _LINE_ONLY_SYNTAX.search(pattern) else re.compile(pattern, re.MULTILINE)
    includer = re.compile(include).fullmatch if include is not None else None
    hits: list[list[Any]] = []
    counts = {"binary": 0, "unreadable": 0}

    def search(text: str, rel: str, inode: int) -> None:
        if prefilter is not None and prefilter.search(text) is None:
            return
        for number, line in enumerate(text.split("\n"), 1):
            if regex.search(line):
                hits.append([rel, number, line, inode])

    def on_file(dir_fd: int, raw: str, rel: str, inode: int) -> None:
        if includer is not None and not includer(rel.rpartition("/")[2] if include_basename else rel):
            return
        try:
            fd = os.open(raw, _FILE_OPEN, dir_fd=dir_fd)
        except OSError:
            counts["unreadable"] += 1
            return
        with open(fd, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            counts["binary"] += 1
            return
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        search(text, rel, inode)

    fd, is_dir, leaf = _open_root(base, path, confine)
    unreadable_dirs = 0
    if is_dir:
        unreadable_dirs = _walk(fd, on_file)
    else:
        with open(fd, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
            search(text.replace("\r\n", "\n").replace("\r", "\n"), escape_name(leaf), 0)
        except UnicodeDecodeError:
            counts["binary"] += 1
    return {"hits": hits, "binary_files": counts["binary"],
            "unreadable_files": counts["unreadable"], "unreadable_dirs": unreadable_dirs}
