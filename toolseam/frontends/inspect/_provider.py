"""``ToolseamSandboxEnvironment``: inspect_ai's ``SandboxEnvironment`` over ``Toolkit.sandbox``.

One toolseam session per sample, in a workspace directory of its own (removed at cleanup), so
an eval that says ``sandbox="toolseam"`` instead of ``"docker"`` keeps everything else: relative
paths and the default cwd are the sample's workspace (``/workspace`` in a container).

How inspect's contract maps (inspect_ai/util/_sandbox/environment.py):

* ``exec``: ``Toolkit.sandbox.exec`` — argv never parsed by a shell, stdin, cwd, env, user.
  A timeout kills the whole job inside the sandbox and raises ``TimeoutError`` (the partial
  output as ``truncated_output``); there is no host-side hang to retry, so ``timeout_retry``
  changes nothing. A signal's end is ``128 + N``, as a shell and ``docker exec`` report it.
  Output above ``INSPECT_SANDBOX_MAX_EXEC_OUTPUT_SIZE`` per stream raises
  ``OutputLimitExceededError`` with the kept head and tail. A user the sandbox cannot switch to
  raises ``SandboxUserUnsupportedError``; one it does not know is a failed result naming it. A
  sandbox that is gone raises ``SandboxUnavailableError``.
* ``read_file``/``write_file``: whole files; ``FileNotFoundError``, ``PermissionError``,
  ``IsADirectoryError``; a file above ``INSPECT_SANDBOX_MAX_READ_FILE_SIZE`` raises
  ``OutputLimitExceededError`` without being read. Text is UTF-8, newlines kept as they are.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal, cast, overload

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from pydantic import BaseModel, ValidationError

from ...backends import backend_for, backend_kind
from ...backends.containers.engine.attach import TlsFiles
from ...backends.containers.engine.protocol import Hardening
from ...policy.settings import Settings, describe_validation_error, parse_settings
from ...seam.capabilities import EngineShell, hand_workspace_to_sandbox, supports
from ...seam.errors import ConfigurationError, CouldNotRunError
from ...session.lifetime import lifetime_for
from ...session.raw import FileLimitError, UnknownUserError, UserUnsupportedError
from ...session.toolkit import Toolkit
from . import _cleanup
from ._config import ToolseamSandboxConfig

logger = logging.getLogger(__name__)

WORKSPACE_PREFIX = _cleanup.WORKSPACE_PREFIX
SESSION_PREFIX = _cleanup.SESSION_PREFIX


def resolve_config(config: SandboxEnvironmentConfigType | None) -> ToolseamSandboxConfig:
    """The config inspect hands over: None (defaults), our model, or a JSON/YAML file name."""
    if config is None:
        return ToolseamSandboxConfig()
    if isinstance(config, ToolseamSandboxConfig):
        return config
    try:
        if isinstance(config, str):
            text = Path(config).read_text(encoding="utf-8")
            if config.endswith((".yaml", ".yml")):
                import yaml  # type: ignore[import-untyped]  # inspect_ai depends on pyyaml

                return ToolseamSandboxConfig.model_validate(yaml.safe_load(text) or {})
            return ToolseamSandboxConfig.model_validate_json(text)
        if isinstance(config, BaseModel):
            return ToolseamSandboxConfig.model_validate(config.model_dump())
    except OSError as exc:
        raise ConfigurationError(f"toolseam sandbox config {config}: {exc.strerror}") from None
    except ValidationError as exc:
        raise ConfigurationError(
            f"toolseam sandbox config: {describe_validation_error(exc)}") from None
    raise ConfigurationError(f"toolseam sandbox config: cannot use a {type(config).__name__}")


def session_settings(config: ToolseamSandboxConfig) -> Settings:
    """The settings mapping with the config's own ``pull`` and ``limits`` over it, validated
    whole (``limits: {network: egress}`` beside ``settings: {egress_allow: [...]}``)."""
    data = dict(config.settings)
    if config.pull is not None:
        data["pull"] = config.pull
    if config.limits is not None:
        data["limits"] = config.limits.model_dump()
    return parse_settings(data, "toolseam sandbox config: settings")


def backend_options(config: ToolseamSandboxConfig, workspace: str,
                    session: str | None = None) -> dict[str, Any]:
    """The backend's options; a container's workspace is the sample's own dir (bind-mounted
    or copied), never the current directory, and its name the sample's ``session`` (what
    ``cli_cleanup`` finds it by)."""
    kind = backend_kind(config.backend)
    if not kind.contained:
        refused = [name for name in ("image", "endpoint", "tls_cert_path")
                   if getattr(config, name) is not None]
        if "read_only_root" in config.model_fields_set:
            refused.append("read_only_root")
        if config.rootless or config.workspace_mode != "auto":
            refused.append("rootless" if config.rootless else "workspace_mode")
        if refused:
            raise ConfigurationError(f"toolseam sandbox config: {', '.join(refused)} apply to a "
                                     "container backend, not host")
        return {}
    options: dict[str, Any] = {"workspace_mode": config.workspace_mode, "workspace": workspace,
                               "hardening": Hardening(read_only_root=config.read_only_root)}
    if session is not None:
        options["session_id"] = session
    if config.image is not None:
        options["image"] = config.image
    if config.endpoint is not None:
        options["endpoint"] = config.endpoint
    if config.tls_cert_path is not None:
        if "tls" not in kind.own_options:
            raise ConfigurationError("toolseam sandbox config: tls_cert_path is a docker option")
        options["tls"] = TlsFiles.from_dir(config.tls_cert_path)
    if config.rootless:
        if "rootless" not in kind.own_options:
            raise ConfigurationError("toolseam sandbox config: rootless is a podman option")
        options["rootless"] = True
    return options


@sandboxenv(name="toolseam")
class ToolseamSandboxEnvironment(SandboxEnvironment):
    """A sample's sandbox: one toolseam session (``Toolkit``) in its own workspace."""

    _live: dict[str, ToolseamSandboxEnvironment] = {}  # session id -> env, for task_cleanup

    def __init__(self, toolkit: Toolkit, workspace: str, task_name: str) -> None:
        super().__init__()
        self.toolkit = toolkit
        self.workspace = workspace
        self.task_name = task_name
        self._closed = False

    # --- lifecycle ------------------------------------------------------------------------
    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return ToolseamSandboxConfig(**config)

    @classmethod
    def default_concurrency(cls) -> int | None:
        return None  # a toolseam sandbox is one container (or agent): the machine is the limit

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Check the config now: a mistake fails the task before any sample starts."""
        chosen = resolve_config(config)
        settings = session_settings(chosen)
        workspace = tempfile.gettempdir()  # not opened: nothing is mounted or written
        backend_for(chosen.backend, workspace, settings.limits,
                    backend_options(chosen, workspace), settings.pull,
                    lifetime_for(settings).backend_lifetime)

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        chosen = resolve_config(config)
        settings = session_settings(chosen)
        session = _cleanup.new_session()
        workspace = tempfile.mkdtemp(prefix=f"{WORKSPACE_PREFIX}{session}-",
                                     dir=chosen.workspace_parent)
        try:
            # the settings' lifetime (orphan_timeout_s: durable) is the backend's, chosen
            # when it is built (seam/lifetime.py)
            backend = backend_for(chosen.backend, workspace, settings.limits,
                                  backend_options(chosen, workspace, session), settings.pull,
                                  lifetime_for(settings).backend_lifetime)
            hand_workspace_to_sandbox(backend, workspace)  # a rootless engine's root: its user
            toolkit = Toolkit(backend, base_dir=None if backend_kind(chosen.backend).contained else workspace,
                              settings=settings, tools={"bash": False}, session_id=session)
            try:
                await toolkit.open()
            except BaseException:
                with contextlib.suppress(Exception):
                    await toolkit.close()
                raise
        except BaseException:
            shutil.rmtree(workspace, ignore_errors=True)
            raise
        env = cls(toolkit, workspace, task_name)
        cls._live[session] = env
        return {"default": env}

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment],
                             interrupted: bool) -> None:
        for environment in environments.values():
            if isinstance(environment, ToolseamSandboxEnvironment):
                await environment.close()

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                           cleanup: bool) -> None:
        """Close whatever sample of this task is still open (an interrupted run)."""
        if not cleanup:
            return
        for env in [e for e in cls._live.values() if e.task_name == task_name]:
            await env.close()

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup toolseam [id]``: every container, volume and workspace
        this provider made (on the engines this machine's settings name), or only session ``id``."""
        await _cleanup.remove_everything(id)

    async def close(self) -> None:
        """End the session (every process, the container, its volumes) and drop the workspace."""
        if self._closed:
            return
        self._closed = True
        self._live.pop(self.toolkit.session_id, None)
        try:
            await self.toolkit.close()
        except CouldNotRunError as exc:  # copy mode could not bring changes home: not wanted here
            logger.warning("toolseam sandbox %s: %s", self.toolkit.session_id, exc.reason)
            await _cleanup.remove_everything(self.toolkit.session_id)
        finally:
            shutil.rmtree(self.workspace, ignore_errors=True)

    # --- the sandbox ----------------------------------------------------------------------
    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None,
                   timeout: int | None = None, timeout_retry: bool = True,
                   concurrency: bool = True) -> ExecResult[str]:
        try:
            done = await self.toolkit.sandbox.exec(
                cmd, stdin=input, cwd=cwd, env=env, user=user, timeout=timeout,
                output_limit=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE)
        except UserUnsupportedError as exc:
            raise SandboxUserUnsupportedError(str(exc)) from None
        except UnknownUserError as exc:
            return ExecResult(success=False, returncode=126, stdout="",
                              stderr=f"unable to find user {user}: {exc}\n")
        except CouldNotRunError as exc:
            raise SandboxUnavailableError(exc.reason) from None
        if done.timed_out:
            error = TimeoutError(f"Command timed out after {timeout} seconds")
            error.truncated_output = done.stdout + done.stderr  # type: ignore[attr-defined]
            raise error
        if done.stdout_truncated or done.stderr_truncated:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                                           done.stdout + done.stderr)
        code = done.exit_code if done.signal is None else 128 + done.signal
        return ExecResult(success=code == 0, returncode=code if code is not None else 1,
                          stdout=done.stdout, stderr=done.stderr)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        try:
            await self.toolkit.sandbox.write_bytes(file, contents)
        except CouldNotRunError as exc:
            raise SandboxUnavailableError(exc.reason) from None

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        try:
            data = await self.toolkit.sandbox.read_bytes(
                file, limit=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE)
        except FileLimitError:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR,
                                           None) from None
        except CouldNotRunError as exc:
            raise SandboxUnavailableError(exc.reason) from None
        return data.decode("utf-8") if text else data

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        backend = self.toolkit.backend
        access = (cast(EngineShell, backend).shell_access(user) if supports(backend, EngineShell)
                  else None)
        if access is None:
            raise NotImplementedError(f"the {backend.name} backend runs on this machine: cd "
                                      f"{self.workspace}")
        return SandboxConnection(type="toolseam", container=access.container,
                                 command=access.command)

    def default_polling_interval(self) -> float:
        return 0.2  # a call costs about a millisecond here
