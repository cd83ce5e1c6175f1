"""The container examples of docs/raw-sandbox.md and docs/pool.md run as written (issue 33,
item 6): the raw-sandbox example passed a host directory as a container ``base_dir`` (a path
inside the sandbox), the pool example a ``read_scope`` value that does not exist.

Each example is taken from its page, with only what this machine must differ in replaced (the
image, the pool's size, a host directory that exists here); every replaced text must still be
on the page, so an edited example is noticed here rather than silently skipped.
"""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from toolseam import Toolkit

from .engines import IMAGE, endpoint, remove_shared, shared_dir

DOCS = Path(__file__).resolve().parents[1] / "docs"


def example(page: str, marker: str, replace: dict[str, str]) -> str:
    """The fenced python block of ``page`` that holds ``marker``, with ``replace`` applied."""
    blocks: list[str] = re.findall(r"^```python\n(.*?)^```", (DOCS / page).read_text(), re.M | re.S)
    (code,) = [block for block in blocks if marker in block]
    for old, new in replace.items():
        assert old in code, f"{page}: the example no longer holds {old!r}"
        code = code.replace(old, new)
    return code


async def run(code: str, **names: Any) -> dict[str, Any]:
    """``code`` as the body of a coroutine, awaited with ``names`` in scope; its locals."""
    source = ("async def example(" + ", ".join(names) + "):\n"
              + textwrap.indent(code, "    ") + "    return locals()\n")
    scope: dict[str, Any] = {"Toolkit": Toolkit}
    exec(compile(source, "<docs example>", "exec"), scope)
    found: dict[str, Any] = await scope["example"](**names)
    return found


@pytest.mark.asyncio
async def test_the_raw_sandbox_example_runs_on_rootless_podman() -> None:
    endpoint("podman-rootless")  # the example's engine: a visible skip (CI: a failure) without it
    workdir = shared_dir()
    try:
        for sub in ("src", "data"):
            (workdir / sub).mkdir()
            os.chmod(workdir / sub, 0o777)  # the rootless engine's user writes here
        (workdir / "data" / "out.bin").write_bytes(b"out")
        code = example("raw-sandbox.md", "tools.sandbox.exec", {
            '"rootless": True}': '"rootless": True, "image": IMAGE}'})
        found = await run(code, workdir=str(workdir), IMAGE=IMAGE)
        assert found["done"].exit_code == 0 and found["done"].stdout == "hello\n", found["done"]
        assert found["data"] == b"out"
        assert (workdir / "data" / "in.bin").read_bytes() == b"\x00\x01"  # the host directory
    finally:
        remove_shared(workdir)


@pytest.mark.asyncio
async def test_the_pool_example_runs_on_podman() -> None:
    endpoint("podman")
    from toolseam import SandboxLimits, SandboxPool  # noqa: F401 (the example imports them)

    workdir = shared_dir()
    try:
        code = example("pool.md", "pool.toolkit(", {
            'image="my/sandbox:1"': "image=IMAGE", "size=16": "size=2",
            '"/srv/run-42"': "workdir", '"make test"': '"echo made > made.txt"'})
        await run(code, workdir=str(workdir), IMAGE=IMAGE)
        assert (workdir / "made.txt").read_text() == "made\n"
    finally:
        remove_shared(workdir)
