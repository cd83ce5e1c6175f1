"""Every host setting in one validated model, loadable from a TOML or JSON file.

A file carries ``schema_version``. Older versions upgrade additively: a field a version did not
know takes its default, so no existing file changes meaning. Unknown keys, wrong types and
out-of-range values are refused with a message naming the field.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..seam.errors import ConfigurationError
from ..seam.models import MAX_MS
from .limits import InputLimits, SandboxLimits

SCHEMA_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)  # 1: before timeouts, jobs and read scope were settings

KILL_DEFAULT_TIMEOUT_MS = 60_000
DETACH_DEFAULT_TIMEOUT_MS = 600_000


class Settings(BaseModel):
    """What a host decides; the model decides nothing here."""

    # strict: "3600000" is not a number and true is not a count — a file says what it means
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    def __init__(self, **data: Any) -> None:
        # Settings(...) from Python: the same one-line error as a settings file, not pydantic's
        # own (its input_value dumps and documentation links). ConfigurationError is no
        # ValueError, so pydantic passes it through model_validate unwrapped.
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigurationError(f"settings: {describe_validation_error(exc)}") from None

    schema_version: int = Field(SCHEMA_VERSION, description="Version of the file's shape.")
    timeout_policy: Literal["kill", "detach"] = Field(
        "kill", description="What the DEFAULT timeout does: kill the job, or detach it as a job.")
    default_timeout_ms: int | None = Field(
        None, ge=0, le=MAX_MS, description="Default timeout; None: 60 000 (kill) or 600 000 (detach). "
        "0 means unbounded and is only accepted with the detach policy.")
    timeout_range_ms: tuple[int, int] | None = Field(
        None, description="Accepted [min, max] for per-call and default timeouts (e.g. 1000, 300000).")
    job_max_ms: int = Field(3_600_000, gt=0, le=MAX_MS,
                            description="Ceiling of a detached job, from its start.")
    max_jobs: int = Field(3, gt=0, description="Detached jobs running at once per session.")
    kill_grace_ms: int = Field(2000, ge=0, le=MAX_MS, description="Between SIGTERM and SIGKILL.")
    output_limit_bytes: int = Field(1 << 20, ge=2, description="Kept per stream, head + tail.")
    model_output_chars: int = Field(
        30_000, ge=1000, description="Most characters of one result's text a model is shown "
        "(ToolResult.model_text); a cut is marked there, the whole output kept in a file.")
    read_max_bytes: int = Field(
        10 << 20, gt=0, description="Largest whole-file read; above it, read asks for a window.")
    shell: list[str] | None = Field(
        None, min_length=1, description="Verbatim argv prefix for bash, e.g. [\"bash\", \"-lc\"].")
    shell_id: str | None = Field(None, description="A shell catalog id (bash, sh, cmd, …).")
    read_scope: Literal["working-dir", "unrestricted"] | None = Field(
        None, description="Read-scope policy; None: the policy is off.")
    env_allow: list[str] = Field(
        default_factory=list, description="Host variables passed to commands despite the secret filter.")
    portable_names: bool = Field(False, description="Refuse Windows reserved names everywhere.")
    output_style: Literal["toolseam", "toolnexus"] = Field(
        "toolseam", description="'toolnexus' keeps the bytes toolnexus 0.21 transcripts saw: "
        "read returns raw text, an empty grep/glob result is an empty string.")
    read_default_lines: int = Field(2000, gt=0, description="Lines a read returns without a limit.")
    read_page_bytes: int = Field(50 * 1024, gt=0, description="Text a read page holds at most.")
    line_max_chars: int = Field(2000, gt=0, description="Longer lines are cut in read and grep.")
    search_timeout_ms: int = Field(60_000, gt=0, le=MAX_MS,
                                   description="A grep still searching after this is stopped.")
    media_max_bytes: int = Field(5 << 20, gt=0, description="Largest image/PDF/audio attachment.")
    pull: Literal["never", "missing", "always"] = Field(
        "missing", description="Container images: never pull, pull when missing, or always.")
    limits: SandboxLimits = Field(default_factory=SandboxLimits,
                                  description="Container sandbox limits (memory, cpus, pids, …).")
    input_limits: InputLimits = Field(
        default_factory=InputLimits, description="Longest tool arguments and serve --stdio lines "
        "(command, pattern, path, content; line size and nesting depth).")
    orphan_timeout_s: float = Field(
        0, ge=0, le=7 * 24 * 3600, description="How long a sandbox whose client died or detached "
        "waits for an attach before it ends itself and everything in it (docs/sessions.md); "
        "0: the session ends with its client, and detach is refused.")
    write_requires_read: bool = Field(
        False, description="Refuse write over an existing file not read in this session.")
    # Egress (docs/network.md): only with limits.network = "egress"; checked whole at open.
    egress_allow: list[str] = Field(default_factory=list, description=(
        "Hosts a sandbox in egress mode may reach: HOST, HOST:PORT, *.DOMAIN[:PORT], IP[:PORT]; "
        "without a port, 80 and 443."))
    egress_private: bool = Field(False, description=(
        "Egress may reach loopback, private and link-local addresses (mirrors on the LAN)."))
    egress_resolve: dict[str, str] = Field(default_factory=dict, description=(
        "Egress: name -> address pins used instead of DNS (air-gapped mirrors, tests)."))
    egress_credentials: list[dict[str, str]] = Field(default_factory=list, description=(
        "Egress: {host, header, value_env} — the header added outside the sandbox to requests "
        "to that host, its value read from the toolseam process's environment at open."))
    egress_ca_file: str | None = Field(None, description=(
        "Egress: extra PEM roots for verifying upstreams whose TLS the proxy terminates (and, "
        "with egress_trust_host_cas, for the sandbox's own clients)."))
    egress_trust_host_cas: bool = Field(False, description=(
        "Egress: add the host's trusted CAs (its system store, plus egress_ca_file) to the "
        "sandbox's CA bundle — for networks whose gateway inspects TLS with its own CA."))
    egress_max_connections: int = Field(64, ge=1, le=4096, description=(
        "Egress: connections at once per session; more are answered 503."))
    egress_idle_timeout_s: float = Field(300.0, gt=0, le=86400, description=(
        "Egress: a connection with no bytes either way this long is closed."))
    egress_connect_timeout_s: float = Field(15.0, gt=0, le=600, description=(
        "Egress: resolving and connecting upstream must finish within this."))
    egress_log_kept: int = Field(10_000, ge=1, le=10_000_000, description=(
        "Egress: audit events egress_log() keeps (the newest); on_egress, serve and MCP "
        "stream every one."))

    @field_validator("timeout_range_ms", mode="before")
    @classmethod
    def _pair(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value  # JSON and TOML have no tuple

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.schema_version not in SUPPORTED_VERSIONS:
            raise ValueError(f"schema_version {self.schema_version} is not one of "
                             f"{', '.join(map(str, SUPPORTED_VERSIONS))}")
        if self.default_timeout_ms == 0 and self.timeout_policy == "kill":
            raise ValueError("default_timeout_ms 0 (unbounded) needs timeout_policy 'detach'")
        if self.timeout_range_ms is not None:
            low, high = self.timeout_range_ms
            if not 0 < low <= high <= MAX_MS:
                raise ValueError("timeout_range_ms must be [min, max] with 0 < min <= max")
            default = self.effective_default_timeout_ms
            if default and not low <= default <= high:
                raise ValueError(f"default timeout {default} ms is outside timeout_range_ms")
        if self.shell is not None and self.shell_id is not None:
            raise ValueError("set shell (an argv prefix) or shell_id, not both")
        self._check_egress()
        return self

    def egress_table(self) -> dict[str, Any]:
        """The ``egress_*`` settings as ``EgressPolicy`` takes them."""
        table = {name: getattr(self, name) for name in _EGRESS_RULE_FIELDS}
        table.update({name.removeprefix("egress_"): getattr(self, name)
                      for name in _EGRESS_LIMIT_FIELDS})
        return table

    def _check_egress(self) -> None:
        given = sorted(name for name in (*_EGRESS_RULE_FIELDS, *_EGRESS_LIMIT_FIELDS)
                       if getattr(self, name) != Settings.model_fields[name].get_default(
                           call_default_factory=True))
        if self.limits.network != "egress":
            if given:
                raise ValueError(
                    f"{', '.join(given)}: for a sandbox whose network is 'egress' only (this "
                    f"one's is {self.limits.network!r}): set limits.network = \"egress\" "
                    "(--network egress), or remove them")
            return
        from ..egress.rules import EgressPolicy  # the egress package loads only when used

        try:  # the shape of every rule now; the credentials' values are read at open
            EgressPolicy.model_validate(self.egress_table(), context={"environ": _Unread()})
        except ValidationError as exc:
            raise ValueError(describe_validation_error(exc)) from None

    @property
    def effective_default_timeout_ms(self) -> int:
        if self.default_timeout_ms is not None:
            return self.default_timeout_ms
        return KILL_DEFAULT_TIMEOUT_MS if self.timeout_policy == "kill" else DETACH_DEFAULT_TIMEOUT_MS


_EGRESS_RULE_FIELDS = ("egress_allow", "egress_private", "egress_resolve", "egress_credentials",
                       "egress_ca_file", "egress_trust_host_cas")
_EGRESS_LIMIT_FIELDS = ("egress_max_connections", "egress_idle_timeout_s",
                        "egress_connect_timeout_s", "egress_log_kept")


class _Unread(dict[str, str]):
    """An environment in which every variable is set: checks a credential rule's shape without
    reading (or needing) its secret."""

    def get(self, key: str, default: object = None) -> str:
        return "unread"


def parse_settings(data: dict[str, Any], source: str = "settings") -> Settings:
    """Validate a mapping; a version-1 mapping upgrades by taking defaults for new fields."""
    upgraded = dict(data)
    upgraded.setdefault("schema_version", SCHEMA_VERSION)
    try:
        settings = Settings.model_validate(upgraded)
    except ConfigurationError as exc:  # Settings.__init__'s, named "settings": name the source
        raise ConfigurationError(f"{source}: {str(exc).removeprefix('settings: ')}") from None
    except ValidationError as exc:
        raise ConfigurationError(f"{source}: {describe_validation_error(exc)}") from None
    return settings.model_copy(update={"schema_version": SCHEMA_VERSION})


def load_settings(path: str | Path) -> Settings:
    """Read settings from a ``.toml`` or ``.json`` file."""
    return parse_settings(read_settings_data(path), str(path))


def read_settings_data(path: str | Path) -> dict[str, Any]:
    """A settings file's mapping, not yet validated (the CLI merges its flags into it first)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read settings file {file}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text) if file.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigurationError(f"{file}: not valid {file.suffix.lstrip('.') or 'JSON'}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"{file}: the top level must be a table/object")
    return data


def describe_validation_error(exc: ValidationError) -> str:
    """One line per problem, each naming the field."""
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            parts.append(f"unknown field {field!r}")
        elif error["type"] == "missing":
            parts.append(f"{field} is required")
        else:
            message = error["msg"].removeprefix("Value error, ")
            given = error.get("input")
            if isinstance(given, (str, int, float, bool)) and error["loc"] and \
                    error["loc"][0] != "egress_credentials" and repr(given) not in message:
                shown = repr(given) if len(repr(given)) <= 60 else repr(given)[:57] + "..."
                message = f"{message} (got {shown})"
            parts.append(f"{field}: {message}" if error["loc"] else message)
    return "; ".join(parts)
