"""The README's second install route, for real: build a wheel from this checkout, install it in a
fresh venv, and run the installed ``toolseam`` far from the checkout. The venv borrows this
one's dependencies through a ``.pth`` line (only the build backend, setuptools, comes from the
index, as for any user)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_wheel_built_from_the_checkout_installs_and_runs_elsewhere(tmp_path: Path) -> None:
    # setuptools writes build/ and *.egg-info into the tree it builds: build a copy of what
    # the wheel is made of, never the checkout itself
    source = tmp_path / "source"
    for package in ("toolseam", "toolseam_agent"):
        shutil.copytree(ROOT / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(dist), str(source)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("toolseam-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "toolseam/py.typed" in names and "toolseam_agent/server.py" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "docs/"))]
    assert {n.split("/")[0] for n in names if not n.startswith("toolseam-")} == {"toolseam",
                                                                                 "toolseam_agent"}

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # this venv's dependencies (pydantic, psutil, …), but not its editable toolseam
    Path(site, "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
         "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([str(python), "-c", "import toolseam; print(toolseam.__file__)"],
                           capture_output=True, text=True, cwd=elsewhere, env=env, check=True)
    assert where.stdout.startswith(site), where.stdout  # the wheel's copy, not the checkout
    demo = subprocess.run([str(env_dir / "bin" / "toolseam"), "demo"], capture_output=True,
                          text=True, cwd=elsewhere, env=env, timeout=120)
    assert demo.returncode == 0, demo.stderr
    assert demo.stdout.rstrip().endswith("processes left from the timed-out job: none")
