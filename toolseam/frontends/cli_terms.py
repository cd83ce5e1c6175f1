"""Errors in the command line's own terms: the library words an option as Python does
(``workspace_mode='copy'``, ``endpoint='unix:///…'``); a CLI user types ``--workspace-mode
copy``. The CLI passes every message it prints through ``in_cli_terms`` (issue 46)."""

from __future__ import annotations

import re

# the Python options that have a flag of the same meaning (toolseam/frontends/cli.py)
_FLAGS = {"workspace_mode": "--workspace-mode", "endpoint": "--endpoint", "image": "--image",
          "pull": "--pull", "base_dir": "--base-dir"}
_OPTION = re.compile(r"\b(" + "|".join(_FLAGS) + r")=(['\"])(.*?)\2")
_ROOTLESS = re.compile(r"\brootless=True\b")


def in_cli_terms(message: str) -> str:
    """``message`` with each ``option='value'`` a flag stands for written as that flag."""
    message = _OPTION.sub(lambda m: f"{_FLAGS[m[1]]} {m[3]}", message)
    return _ROOTLESS.sub("--rootless", message)
