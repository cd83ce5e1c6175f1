"""docs/integrations/inspect.md runs: its eval, through ``inspect eval`` on the command line
and as a script, in rootless podman with a scripted model — the log says the sample's bash call
ran in the sandbox and printed 42, and the script prints what the page says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from inspect_ai.log import list_eval_logs, read_eval_log

from ..support.engines import endpoint

PAGE = Path(__file__).resolve().parents[2] / "docs" / "integrations" / "inspect.md"
INSPECT = str(Path(sys.executable).with_name("inspect"))


def _block(language: str) -> str:
    (found,) = re.findall(rf"^```{language}\n(.*?)^```", PAGE.read_text(), re.M | re.S)
    return str(found)


def _env() -> dict[str, str]:
    return {**os.environ, "TOOLSEAM_PODMAN_ROOTLESS_URL": endpoint("podman-rootless"),
            "PYTHONPATH": str(PAGE.parents[2])}


def _leftovers_of(pid: int) -> list[str]:
    """What process ``pid``'s samples left in /tmp: their workspaces are named by their
    session, which names the process (``_cleanup.new_session``). Only the eval's own: another
    worker's inspect tests may hold live sessions of theirs at the same moment (rehearsal 14)."""
    return [p.name for p in Path("/tmp").glob(f"toolseam-inspect-{pid}-*")]


def test_inspect_eval_runs_the_page_in_rootless_podman(tmp_path: Path) -> None:
    (tmp_path / "hello_toolseam.py").write_text(_block("python"))
    with subprocess.Popen([INSPECT, "eval", "hello_toolseam.py", "--log-dir", "logs",
                           "--display", "plain"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, cwd=tmp_path, env=_env()) as done:
        out, err = done.communicate(timeout=300)
    assert done.returncode == 0, out + err
    (info,) = list_eval_logs(str(tmp_path / "logs"))
    log = read_eval_log(info)
    assert log.status == "success" and log.samples is not None
    assert log.results is not None and log.results.scores[0].metrics["accuracy"].value == 1.0
    tool = [m for m in log.samples[0].messages if m.role == "tool"]
    assert [m.text for m in tool] == ["42\n"] and tool[0].error is None  # type: ignore[union-attr]
    assert _leftovers_of(done.pid) == []


def test_the_script_prints_what_the_page_says(tmp_path: Path) -> None:
    (tmp_path / "example.py").write_text(_block("python"))
    done = subprocess.run([sys.executable, "example.py"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout == _block("text")
