"""What every builtin shares: the result type, the call context, input validation, and the
one table that turns a file failure into the sentence the model reads."""

from __future__ import annotations

import dataclasses
import posixpath
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, PrivateAttr, ValidationError

from ..model_text import ModelHints, render
from ..policy.jobs import JobRegistry
from ..policy.limits import not_text, oversized
from ..policy.refusal import Refusal
from ..policy.settings import Settings
from ..policy.shells import ShellChoice
from ..seam.errors import CouldNotRunError, FileOpError
from ..seam.models import JobStatus, PathRef
from ..seam.protocol import BuiltinExec


class ToolResult(BaseModel):
    """What a tool call returns to the host (and, through it, to the model)."""

    model_config = ConfigDict(extra="forbid")

    output: str
    is_error: bool = False
    metadata: dict[str, Any] = {}
    parts: list[dict[str, Any]] | None = None
    # What the builtin tells the model-text renderer (notes, capture gaps, the spill file);
    # private: output, metadata and to_json() stay byte-stable.
    _hints: ModelHints | None = PrivateAttr(None)

    def model_text(self, budget: int | None = None) -> str:
        """The text to show a model for this result: ``output`` held to ``budget`` characters
        (default: the session's ``model_output_chars``, else 30 000) with every cut marked,
        followed by the builtin's notes (exit status, capped listings, why an edit failed).
        See ``toolseam.model_text``."""
        hints = self.__pydantic_private__.get("_hints") or ModelHints()  # type: ignore[union-attr]
        if budget is not None:
            hints = dataclasses.replace(hints, budget=budget)
        return render(self.output, hints)

    @property
    def model_hints(self) -> ModelHints:
        """The hints the renderer reads; made on first use (builtins add notes to them)."""
        # Straight from pydantic's private dict: ``self._hints`` goes through BaseModel's
        # Python-level __getattr__/__setattr__ (3 µs each, twice per call on every tool call).
        private = self.__pydantic_private__
        assert private is not None
        hints: ModelHints | None = private.get("_hints")
        if hints is None:
            hints = private["_hints"] = ModelHints()
        return hints

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"output": self.output, "is_error": self.is_error,
                                "metadata": self.metadata}
        if self.parts is not None:
            data["parts"] = self.parts
        return data


def could_not_run_result(tool: str, exc: CouldNotRunError) -> ToolResult:
    """CONTRACT §2: the sandbox failed, not the command — a result the model can read."""
    return error(f"{tool}: could not run: {exc.reason}", failure="could_not_run",
                 reason=exc.reason, retryable=exc.retryable, cause=exc.cause)


def ok(output: str, **metadata: Any) -> ToolResult:
    return ToolResult(output=output, is_error=False, metadata=metadata)


def error(output: str, **metadata: Any) -> ToolResult:
    return ToolResult(output=output, is_error=True, metadata=metadata)


@dataclass(frozen=True)
class OutputEvent:
    """One live piece of a command's output, attributed to its session and call."""

    session: str
    call: str
    stream: str
    text: str


class SessionView(Protocol):
    """What a builtin may ask of its session (``toolseam.policy.session.Session``)."""

    settings: Settings
    raise_could_not_run: bool
    jobs: JobRegistry
    command_env: dict[str, str]

    @property
    def shell(self) -> ShellChoice: ...
    def new_backend_job_id(self) -> str: ...
    def timeout_problem(self, timeout_ms: int) -> str | None: ...
    async def shell_for_spawn(self) -> ShellChoice: ...
    async def check_read(self, tool: str, path: str) -> None: ...
    async def hidden_in_search(self, tool: str, root: str, rels: set[str]
                               ) -> dict[str, str]: ...
    async def check_command(self, command: str, cwd: str) -> None: ...
    def note_read(self, absolute_path: str) -> None: ...
    def has_read(self, absolute_path: str) -> bool: ...


@dataclass
class CallContext:
    """Everything a builtin may know about the session, handed over per call."""

    backend: BuiltinExec
    base_dir: str
    confine: bool
    session_id: str
    call_id: str
    services: SessionView
    on_output: Callable[[OutputEvent], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def ref(self, path: str | None) -> PathRef:
        if path and self.services.settings.portable_names:
            refuse_reserved_names(path)
        # Plain construction: pydantic-core checks three fields faster than model_construct.
        return PathRef(base=self.base_dir, path=path or ".", confine=self.confine)

    def note_written(self, changes: int) -> None:
        """Bytes of file content this call wrote into the sandbox (the session's accounting,
        ``toolseam.observability``)."""
        self.extra["bytes_written"] = self.extra.get("bytes_written", 0) + changes

    def note_job(self, status: JobStatus) -> None:
        """The job this call ran, as it ended or was last seen (accounting and the command's
        span read it)."""
        self.extra["job"] = status

    def absolute(self, path: str) -> str:
        """The path as the sandbox sees it, relative ones against the base dir (lexical)."""
        return posixpath.normpath(posixpath.join(self.base_dir, path))


WINDOWS_RESERVED = frozenset({"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)),
                              *(f"LPT{i}" for i in range(1, 10))})


def refuse_reserved_names(path: str) -> None:
    """Windows device names (CON, NUL, COM1 …, with or without an extension) are not files: a
    path "inside" the base that names one writes nowhere. Refused when the host asks for
    portable names (and always on Windows, where this library's host backend does not run)."""
    for part in path.replace("\\", "/").split("/"):
        stem = part.split(".")[0].strip().upper()
        if stem in WINDOWS_RESERVED:
            raise FileOpError("invalid", path, f"{stem} is a reserved Windows device name")


Bounds = dict[str, tuple[int | None, int | None]]


def object_schema(props: dict[str, tuple[str, str]], required: list[str],
                  bounds: Bounds | None = None) -> dict[str, Any]:
    """A tool's JSON schema: named properties of one type each (integers with their accepted
    range), nothing else allowed."""
    properties: dict[str, Any] = {}
    for key, (kind, description) in props.items():
        prop: dict[str, Any] = {"type": kind, "description": description}
        low, high = (bounds or {}).get(key, (None, None))
        if low is not None:
            prop["minimum"] = low
        if high is not None:
            prop["maximum"] = high
        properties[key] = prop
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


class InputModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    # Argument names models trained on other tools send (file_path, old_string …), mapped to the
    # canonical ones. The declared schema names only the canonical ones.
    ALIASES: ClassVar[dict[str, str]] = {}

    @classmethod
    def canonical(cls, args: dict[str, Any]) -> dict[str, Any] | str:
        """``args`` with aliases renamed, or the problem when an alias and its name both came."""
        if not cls.ALIASES or not any(k in cls.ALIASES for k in args):
            return args
        renamed: dict[str, Any] = {}
        for key, value in args.items():
            name = cls.ALIASES.get(key, key)
            if name in renamed:
                return f"{key} and {name} name the same field; send one of them"
            renamed[name] = value
        return renamed


InputT = TypeVar("InputT", bound=InputModel)


class Builtin(ABC, Generic[InputT]):
    name: ClassVar[str]
    description: ClassVar[str]
    Input: ClassVar[type[InputModel]]
    schema: ClassVar[dict[str, Any]]

    def input_schema(self, services: SessionView | None = None) -> dict[str, Any]:
        return self.schema

    async def __call__(self, args: Any, ctx: CallContext) -> ToolResult:
        result = await self._checked_run(args, ctx)
        # The session's budget, so result.model_text() needs no argument anywhere.
        result.model_hints.budget = ctx.services.settings.model_output_chars
        return result

    async def _checked_run(self, args: Any, ctx: CallContext) -> ToolResult:
        if not isinstance(args, dict):
            return error(f"{self.name}: arguments must be a JSON object")
        args = self.Input.canonical(args)
        if isinstance(args, str):
            return error(f"{self.name}: invalid input: {args}")
        # Before any parsing or work, and the same for every front end (issue 19): an argument
        # over its limit is the model's mistake to fix, not a sandbox that could not run.
        limits = ctx.services.settings.input_limits
        for name, value in args.items():
            if not isinstance(value, str):
                continue
            problem = oversized(name, value, limits)
            if problem:
                return error(f"{self.name}: {problem}", inputLimit=name)
            problem = not_text(name, value)  # it could never be encoded for the sandbox
            if problem:
                return error(f"{self.name}: {problem}", invalidArgument=name)
        try:
            parsed = self.Input.model_validate(args)
        except ValidationError as exc:
            return error(f"{self.name}: invalid input: {_describe(exc)}")
        try:
            return await self.run(parsed, ctx)  # type: ignore[arg-type]
        except FileOpError as exc:
            return error(file_error_message(self.name, exc, ctx.base_dir))
        except Refusal as exc:
            return error(str(exc), refused=True)
        except CouldNotRunError as exc:
            if ctx.services.raise_could_not_run:
                raise
            return could_not_run_result(self.name, exc)

    @abstractmethod
    async def run(self, args: InputT, ctx: CallContext) -> ToolResult: ...


_TYPE_WORDS = {"int_type": "a number", "float_type": "a number", "int_from_float": "a number",
               "string_type": "a string", "bool_type": "a boolean", "dict_type": "an object"}


def _describe(exc: ValidationError) -> str:
    """One phrase per field; a union's per-branch errors collapse into one."""
    parts = []
    for problem in exc.errors():
        name = str(problem["loc"][0]) if problem["loc"] else ""
        kind = problem["type"]
        if kind == "extra_forbidden":
            parts.append(f"unknown field {name!r}")
        elif kind == "missing":
            parts.append(f"{name} is required")
        elif kind in _TYPE_WORDS:
            parts.append(f"{name} must be {_TYPE_WORDS[kind]}")
        else:
            message = problem["msg"].removeprefix("Value error, ")
            parts.append(f"{name}: {message}" if name else message)
    return "; ".join(dict.fromkeys(parts))


_MESSAGES = {
    "not_found": "{tool}: {p} does not exist",
    "is_directory": "{tool}: {p} is a directory",
    "not_directory": "{tool}: {p} is not a directory (or a part of it is not)",
    "not_regular": "{tool}: {p} is not a regular file ({detail})",
    "not_utf8": "{tool}: {p} is not valid UTF-8 text",
    "outside_base": "{tool}: {p} resolves outside baseDir {base}",
    "permission": "{tool}: permission denied: {p}",
    "exists": "{tool}: {p} already exists",
    "stale": "{tool}: {p} changed while the change was being applied; read it again",
    "too_large": "{tool}: {p} is too large ({detail} bytes)",
    "invalid": "{tool}: invalid path {p!r}: {detail}",
    "bad_pattern": "{tool}: invalid pattern {p!r}: {detail}",  # from the search process
}


def file_error_message(tool: str, exc: FileOpError, base: str) -> str:
    template = _MESSAGES.get(exc.code, "{tool}: {p}: {detail}")
    return template.format(tool=tool, p=exc.path, base=base, detail=exc.detail or exc.code)


def _whole_number(minimum: int, maximum: int | None = None) -> BeforeValidator:
    """JSON numbers arrive as int or float; a count must be a whole number in range."""

    def check(value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("must be a number")
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"must be a whole number, got {value}")
        if value < minimum:
            raise ValueError(f"must be >= {minimum}, got {value:g}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be <= {maximum}, got {value:g}")
        return int(value)

    return BeforeValidator(check)


WholeFrom0 = Annotated[int, _whole_number(0)]
WholeFrom1 = Annotated[int, _whole_number(1)]
# Milliseconds the agents' timers take (a signed 32-bit count, about 24.8 days).
MAX_TIMEOUT_MS = 2**31 - 1
Milliseconds = Annotated[int, _whole_number(1, MAX_TIMEOUT_MS)]
JobId = Annotated[int, _whole_number(1, 2**31 - 1)]
