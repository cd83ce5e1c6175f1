"""``ToolseamSandbox``: toolseam as a LangChain deepagents sandbox backend (``BaseSandbox``).

``create_deep_agent(..., backend=ToolseamSandbox("podman", image=...))`` runs the agent's
``execute``, file and search tools in a toolseam sandbox — the host, rootful or rootless
podman, or docker. It passes langchain-tests' ``SandboxIntegrationTests``
(tests/contract/test_provider_deepagents.py; docs/integrations/deepagents.md).

``execute`` goes through the raw API (one argv, killed whole at its timeout; what it leaves
running in the background lives on, as with deepagents' own shell, until the sandbox ends);
``upload_files``/``download_files`` through its whole-file bytes; reading, editing, listing,
grep and glob through toolseam's own file operations where they answer exactly what deepagents
asks (toolseam's read window, edit, search and listing), with no script run in the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
from collections.abc import Coroutine
from typing import Any, TypeVar, Unpack

from deepagents.backends.protocol import (
    EditResult,
    ExecuteResponse,
    FileDownloadResponse,
    FileOperationError,
    FileUploadResponse,
    GrepResult,
    ReadResult,
)
from deepagents.backends.sandbox import BaseSandbox

from ..seam.errors import CouldNotRunError
from ..session.options import ToolkitOptions
from ..session.raw import ExecResult, FileLimitError
from ..session.toolkit import Toolkit
from . import _deepagents_files as files
from ._session import LoopThread, Workspace, check_choice, toolkit_arguments

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 120  # deepagents' own local shell backend's default
TIMEOUT_EXIT = 124  # what `timeout(1)` and deepagents' local shell answer
TRANSFER_LIMIT = 1 << 31
# the command's stderr joins its stdout on one pipe, so the output keeps the order it was written
_MERGED = 'exec 2>&1; eval "$1"'


class ToolseamSandbox(BaseSandbox):
    """A deepagents sandbox backend in a toolseam session, open from construction.

    Args:
        backend: a name of the backend table (``toolseam.BACKENDS``: ``"host"`` and the engines).
        image: the container image (podman, docker).
        workspace: the host directory the sandbox works in (the host backend's working dir, or
            the directory a container binds at ``/workspace``). Default: a private temporary
            directory, removed when the sandbox is deleted.
        timeout: seconds an ``execute`` may run by default (its ``timeout`` overrides it).
        output_limit: bytes of a command's output kept (its head and tail); more sets
            ``truncated``.
        options: ``Toolkit`` keyword arguments (``settings``, ``env_extra``,
            ``backend_options`` such as ``endpoint`` or ``rootless`` …).

    ``delete()`` (no argument) ends the sandbox; ``delete(path)`` is deepagents' file delete.
    ``await ToolseamSandbox.acreate(...)`` opens one from async code without blocking its loop.
    """

    def __init__(self, backend: str = "host", *, image: str | None = None,
                 workspace: str | None = None, timeout: int = DEFAULT_TIMEOUT_S,
                 output_limit: int | None = None, **options: Unpack[ToolkitOptions]) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        check_choice(backend, image)
        self._timeout, self._output_limit = timeout, output_limit
        self._workspace = Workspace(workspace)
        self._runner = LoopThread("toolseam-deepagents")
        try:
            arguments = toolkit_arguments(backend, image, self._workspace, options)
            self.toolkit: Toolkit = self._runner.run(_opened(backend, arguments))
        except BaseException:
            self._runner.stop()
            self._workspace.remove()
            raise

    @classmethod
    async def acreate(cls, backend: str = "host", **options: Any) -> ToolseamSandbox:
        """``ToolseamSandbox(...)`` from async code (the open runs on a worker thread)."""
        return await asyncio.to_thread(cls, backend, **options)

    @property
    def id(self) -> str:
        return self.toolkit.session_id

    @property
    def working_dir(self) -> str:
        """Where commands start and relative paths resolve."""
        return self.toolkit.base_dir

    # --- the session ----------------------------------------------------------------------
    def delete(self, file_path: str | None = None) -> Any:
        """Without an argument: end the sandbox — every process, the container, the workspace
        directory if this object made it. With a path: deepagents' file delete."""
        if file_path is not None:
            return super().delete(file_path)
        self.close()
        return None

    async def adelete(self, file_path: str | None = None) -> Any:
        if file_path is not None:
            return await asyncio.to_thread(super().delete, file_path)
        await asyncio.to_thread(self.close)
        return None

    def close(self) -> None:
        """End the sandbox (idempotent)."""
        if self._runner.stopped:
            return
        try:
            self._runner.run(self.toolkit.close())
        finally:
            self._runner.stop()
            self._workspace.remove()

    def __del__(self) -> None:
        # a forgotten sandbox still ends (no orphaned process or container), as SyncToolkit's
        if not getattr(self, "_runner", None) or self._runner.stopped:
            return
        with contextlib.suppress(Exception):  # nothing may escape a finaliser
            self.close()

    def __enter__(self) -> ToolseamSandbox:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _sync(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coroutine)

    async def _async(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return await self._runner.submit(coroutine)

    # --- execute ----------------------------------------------------------------------------
    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        return self._sync(self._execute(command, timeout))

    async def aexecute(self, command: str, *, timeout: int | None = None
                       ) -> ExecuteResponse:
        return await self._async(self._execute(command, timeout))

    async def _execute(self, command: str, timeout: int | None) -> ExecuteResponse:
        if not command or not isinstance(command, str):
            return ExecuteResponse(output="Error: Command must be a non-empty string.",
                                   exit_code=1)
        seconds = self._timeout if timeout is None else timeout
        if seconds <= 0:
            raise ValueError(f"timeout must be positive, got {seconds}")
        try:
            result = await self.toolkit.sandbox.exec(["sh", "-c", _MERGED, "sh", command],
                                                     timeout=seconds,
                                                     output_limit=self._output_limit,
                                                     keep_detached=True)
        except CouldNotRunError as exc:
            return ExecuteResponse(output=f"Error: the sandbox could not run the command: {exc}",
                                   exit_code=None)
        return _response(result, seconds, timeout is not None)

    # --- files through toolseam's own operations (_deepagents_files.py) ---------------------
    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return self._sync(files.read(self.toolkit, file_path, offset, limit))

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return await self._async(files.read(self.toolkit, file_path, offset, limit))

    def edit(self, file_path: str, old_string: str, new_string: str,
             replace_all: bool = False) -> EditResult:
        return self._sync(files.edit(self.toolkit, file_path, old_string, new_string,
                                     replace_all))

    async def aedit(self, file_path: str, old_string: str, new_string: str,
                    replace_all: bool = False) -> EditResult:
        return await self._async(files.edit(self.toolkit, file_path, old_string, new_string,
                                            replace_all))

    def grep(self, pattern: str, path: str | None = None, glob: str | None = None, *,
             max_count: int | None = None) -> GrepResult:
        return self._sync(files.grep(self.toolkit, pattern, path, glob, max_count,
                                     self.grep_exclude_dirs))

    async def agrep(self, pattern: str, path: str | None = None, glob: str | None = None, *,
                    max_count: int | None = None) -> GrepResult:
        return await self._async(files.grep(self.toolkit, pattern, path, glob, max_count,
                                            self.grep_exclude_dirs))

    # --- whole files --------------------------------------------------------------------------
    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return self._sync(self._upload(files))

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        return await self._async(self._upload(files))

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return self._sync(self._download(paths))

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        return await self._async(self._download(paths))

    async def _upload(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        answers = []
        for path, content in files:
            error: FileOperationError | None = None
            if not posixpath.isabs(path):
                error = "invalid_path"
            else:
                try:
                    await self.toolkit.sandbox.write_bytes(path, content)
                except OSError as exc:
                    error = _file_error(exc)
            answers.append(FileUploadResponse(path=path, error=error))
        return answers

    async def _download(self, paths: list[str]) -> list[FileDownloadResponse]:
        answers = []
        for path in paths:
            if not posixpath.isabs(path):
                answers.append(FileDownloadResponse(path=path, error="invalid_path"))
                continue
            try:
                data = await self.toolkit.sandbox.read_bytes(path, limit=TRANSFER_LIMIT)
            except (OSError, FileLimitError) as exc:
                answers.append(FileDownloadResponse(path=path, error=_file_error(exc)))
                continue
            answers.append(FileDownloadResponse(path=path, content=data))
        return answers


async def _opened(backend: str, arguments: dict[str, Any]) -> Toolkit:
    toolkit = Toolkit(backend, **arguments)
    await toolkit.open()
    return toolkit


def _response(result: ExecResult, seconds: int, given: bool) -> ExecuteResponse:
    output = result.stdout
    if result.timed_out:
        advice = ("" if given else " For long-running commands, re-run using the timeout "
                  "parameter.")
        output += (f"\nError: Command timed out after {seconds} seconds; it and every process "
                   f"it started were killed.{advice}")
        return ExecuteResponse(output=output, exit_code=TIMEOUT_EXIT,
                               truncated=result.stdout_truncated)
    code = result.exit_code if result.exit_code is not None else 128 + (result.signal or 0)
    return ExecuteResponse(output=output, exit_code=code, truncated=result.stdout_truncated)


def _file_error(exc: Exception) -> FileOperationError:
    if isinstance(exc, FileNotFoundError):
        return "file_not_found"
    if isinstance(exc, IsADirectoryError):
        return "is_directory"
    if isinstance(exc, PermissionError):
        return "permission_denied"
    return "invalid_path"  # not a directory, too large …: the path cannot hold this file


__all__ = ["ToolseamSandbox"]
