"""codex's own apply_patch scenarios, run the way codex's ``tests/suite/scenarios.rs`` runs them:
copy ``input/``, apply ``patch.txt``, compare the whole tree with ``expected/``.

The data is read where it lies (``../shared/peer-data/codex-apply-patch`` beside the checkout,
or ``TOOLSEAM_PEER_DATA``); it is never copied into this repository. Where it is absent (a
user's clone) the tests say so as a skip. Scenarios where toolseam deliberately differs are
listed in ``DIFFERENT`` with what toolseam does instead (docs/contract.md lists them too).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from toolseam import Toolkit

from ..support.engines import backend, remove_shared, shared_dir

REPO = Path(__file__).resolve().parents[2]
PEER_DATA = Path(os.environ.get("TOOLSEAM_PEER_DATA",
                                REPO.parent / "shared" / "peer-data")) / "codex-apply-patch"


def _scenarios() -> list[Path]:
    if not PEER_DATA.is_dir():
        return []
    found = sorted((PEER_DATA / "scenarios").iterdir())
    branches = PEER_DATA / "branch-scenarios"
    if branches.is_dir():
        found += sorted(d for branch in sorted(branches.iterdir()) for d in branch.iterdir())
    return [d for d in found if (d / "patch.txt").is_file()]


# codex leaves earlier files changed when a later operation fails; toolseam's patch is all or
# nothing, so there the tree stays exactly as the input.
DIFFERENT = {"015_failure_after_partial_success_leaves_changes",
             "027_multiple_context_lines_partial_success"}

SCENARIOS = _scenarios()
needs_data = pytest.mark.skipif(not SCENARIOS, reason=f"codex's scenarios are not at {PEER_DATA} "
                                "(they live beside the checkout, in ../shared/peer-data)")


def tree(root: Path) -> dict[str, bytes | str]:
    if not root.is_dir():
        return {}
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            found[rel] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[rel] = path.read_bytes()
        elif path.is_dir() and not any(path.iterdir()):
            found[rel] = "empty dir"
    return found


def copy_fresh(source: Path, work: Path) -> None:
    """The input tree with fresh modes (as a git checkout has them): the shared data may sit on
    a read-only mount, and its 0444 files are not what codex's checkout holds."""
    for path in sorted(source.rglob("*")):
        target = work / path.relative_to(source)
        if path.is_symlink():
            target.symlink_to(os.readlink(path))
        elif path.is_dir():
            target.mkdir(mode=0o777)
            target.chmod(0o777)
        else:
            shutil.copyfile(path, target)
            target.chmod(0o666)


async def run_scenario(tk: Toolkit, work: Path, scenario: Path) -> None:
    if (scenario / "input").is_dir():
        copy_fresh(scenario / "input", work)
    before = tree(work)
    patch = (scenario / "patch.txt").read_bytes().decode("utf-8")
    result = await tk.call("apply_patch", {"patchText": patch})
    expected = before if scenario.name in DIFFERENT else tree(scenario / "expected")
    assert tree(work) == expected, result.output
    if expected == before and scenario.name.split("_", 1)[1].startswith("rejects"):
        assert result.is_error, result.output


def clear(work: Path) -> None:
    for child in work.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


@needs_data
@pytest.mark.parametrize("where", ["host", "docker"])
async def test_codex_scenarios(where: str) -> None:
    """Every scenario, one sandbox per backend (the workspace emptied between scenarios)."""
    work = shared_dir()
    failed: list[str] = []
    try:
        chosen = "host" if where == "host" else backend(where, str(work))
        async with Toolkit(chosen, base_dir=str(work) if where == "host" else "/workspace",
                           confine_to_base_dir=True) as tk:
            for scenario in SCENARIOS:
                clear(work)
                try:
                    await run_scenario(tk, work, scenario)
                except AssertionError as exc:
                    failed.append(f"{scenario.parent.name}/{scenario.name}: {exc}")
    finally:
        remove_shared(work)
    assert not failed, "\n".join(failed)
    assert len(SCENARIOS) >= 23 and {s.name for s in SCENARIOS} >= DIFFERENT
