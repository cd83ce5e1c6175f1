"""One options model (issue 47): ``ToolkitOptions`` is ``Toolkit``'s keyword options, written
once; ``SyncToolkit`` takes it as it is instead of repeating 16 parameters by hand — and both
keep the keyword API their users call."""

from __future__ import annotations

import inspect
import threading
import typing
from pathlib import Path

import pytest

from toolseam import SyncToolkit, Toolkit, ToolkitOptions


def _annotation(value: object) -> str:
    return value.__forward_arg__ if isinstance(value, typing.ForwardRef) else str(value)


def test_the_options_are_toolkits_keywords_name_for_name_and_type_for_type() -> None:
    keywords = {name: p.annotation for name, p in inspect.signature(Toolkit).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    options = {name: _annotation(value) for name, value in ToolkitOptions.__annotations__.items()}
    assert options == keywords
    assert not ToolkitOptions.__required_keys__  # every one optional: Toolkit has the defaults


def test_sync_toolkit_takes_the_options_and_nothing_else_by_hand() -> None:
    parameters = inspect.signature(SyncToolkit).parameters
    assert [(name, p.kind) for name, p in parameters.items()] == [
        ("backend", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("options", inspect.Parameter.VAR_KEYWORD)]
    assert parameters["options"].annotation == "Unpack[ToolkitOptions]"


def test_both_keep_the_keyword_api(tmp_path: Path) -> None:
    options: ToolkitOptions = {"base_dir": str(tmp_path), "confine_to_base_dir": True,
                               "tools": {"bash": False}, "session_id": "s-47",
                               "settings": {"max_jobs": 3}}
    made = Toolkit("host", **options)
    assert (made.confine, made.session_id, made.settings.max_jobs) == (True, "s-47", 3)
    assert "bash" not in made.tool_names and "read" in made.tool_names
    with SyncToolkit("host", base_dir=str(tmp_path), confine_to_base_dir=True,
                     tools={"bash": False}, session_id="s-47", settings={"max_jobs": 3}) as sync:
        made = sync.toolkit
        assert (made.confine, made.session_id, made.settings.max_jobs) == (True, "s-47", 3)
        assert "bash" not in made.tool_names


def test_an_unknown_option_is_named_and_leaves_no_thread() -> None:
    before = set(threading.enumerate())
    with pytest.raises(TypeError, match="'confine'"):
        SyncToolkit("host", confine=True)  # type: ignore[call-arg]
    assert not {t for t in set(threading.enumerate()) - before if t.is_alive()}
