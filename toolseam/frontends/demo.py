"""``toolseam demo``: a scripted agent session on a temporary workspace, host backend.

Each step prints what the model would send (``>>>``), whether the result is an error and how
long it took (``<<<``), the text the model gets back (indented) and the result's metadata.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import time
from typing import Any

import psutil

from ..seam.models import SandboxInfo
from ..session.toolkit import Toolkit

_PATCH = """*** Begin Patch
*** Update File: src/greet.py
@@ def greet(name: str) -> str:
-    return "Hello, " + name
+    return f"Hello, {name}!"
*** Add File: src/farewell.py
+def farewell(name):
+    return f"Goodbye, {name}."
*** Add File: notes/todo.txt
+ship it
*** End Patch"""

# Processes a command can see: in a private pid namespace only its own few.
_VISIBLE = "echo \"processes this command can see: $(ls /proc | grep -c '^[0-9]')\""


def _steps(marks: tuple[str, str]) -> list[tuple[str, dict[str, Any], str]]:
    """The scripted calls; ``marks``: the two sleeps' arguments, this run's own, so the check
    for leftovers never counts another run's (two demos at once on one machine)."""
    return [
        ("write", {"path": "src/greet.py",
                   "content": 'def greet(name):\n    return "Hello, " + name\n'},
         "create a file (parents made, atomic)"),
        ("edit", {"path": "src/greet.py", "oldString": "def greet(name):",
                  "newString": "def greet(name: str) -> str:"}, "exact-string edit"),
        ("apply_patch", {"patchText": _PATCH}, "one patch, three files, all or nothing"),
        ("read", {"path": "src/greet.py"}, "read it back"),
        ("grep", {"pattern": "return", "include": "*.py"}, "search, sorted by path then line"),
        ("glob", {"pattern": "**/*.py"}, "list, sorted, capped"),
        ("read", {"path": "../../etc/passwd"},
         "confinement: a file tool's path leaving the base dir is refused"),
        ("bash", {"command": "ls -d /etc; " + _VISIBLE},
         "confinement does not contain bash: on the host a command reaches what this user can "
         "(a container backend is the boundary); the pid namespace hides other processes"),
        ("bash", {"command": "find . -type f | sort; echo 'pretend the tests failed' >&2; exit 3"},
         "a failing command is a result (exit code in the text and metadata), not an exception"),
        ("bash", {"command": f"(sleep {marks[0]} &) ; setsid sleep {marks[1]} & echo working; "
                             "sleep 60", "timeout": 1500},
         "timeout kills the whole job, grandchildren included"),
    ]


def _isolation(info: SandboxInfo) -> str:
    if info.pid_namespace:
        return ("commands run in a private pid namespace: they cannot see this machine's other "
                "processes, and none of them outlives the session")
    return ("no pid namespace here (unshare missing or refused): commands can see this "
            "machine's other processes; orphans are still caught and killed")


def _shown(args: dict[str, Any]) -> str:
    text = json.dumps(args)
    return text if len(text) <= 100 else text[:99] + "…"


async def run_demo() -> int:
    with tempfile.TemporaryDirectory(prefix="toolseam-demo-") as workspace:
        print(f"workspace: {workspace}  (host backend, file tools confined to it)")
        async with Toolkit("host", base_dir=workspace, confine_to_base_dir=True) as toolkit:
            info = toolkit.info
            assert info is not None
            print(f"shell:     {toolkit.services.shell.label}")
            print(f"isolation: {_isolation(info)}\n")
            marks = (f"4242.{secrets.randbelow(10**6):06d}",
                     f"4243.{secrets.randbelow(10**6):06d}")
            for number, (tool, args, why) in enumerate(_steps(marks), 1):
                started = time.perf_counter()
                result = await toolkit.call(tool, args)
                ms = (time.perf_counter() - started) * 1000
                print(f"[{number}] {why}\n>>> {tool} {_shown(args)}")
                print(f"<<< is_error={result.is_error}  ({ms:.1f} ms)")
                print("    " + result.output.rstrip("\n").replace("\n", "\n    "))
                print(f"    metadata: {json.dumps(result.metadata)}\n")
        left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                if any(a in marks for a in (p.info["cmdline"] or []))]
        print(f"processes left from the timed-out job: {left or 'none'}")
        return 0 if not left else 1
