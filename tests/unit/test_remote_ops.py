"""The remote backend's one table (issue 47): every coroutine method of a forwarded seam
protocol is a row and a method of the client with the protocol's own signature, a capability
the hosted kind lacks is a method the client lacks, and every seam exception crosses the one
error map as itself."""

from __future__ import annotations

import inspect
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from toolseam.backends.agentlink.errors import error_answer, map_seam_error
from toolseam.backends.host import HostBackend
from toolseam.backends.remote import HostedSpec, LoopbackTransport, RemoteBackend, ops
from toolseam.backends.remote.client import expected_capabilities, remote_class
from toolseam.backends.remote.codec import dumps, loads
from toolseam.backends.remote.spec import PLACED
from toolseam.seam import errors, interactive
from toolseam.seam.capabilities import (
    Branching,
    DurableSessions,
    InteractiveProcesses,
    ResourceUsage,
    supports,
)
from toolseam.seam.handle import AttachError
from toolseam.seam.models import COULD_NOT_RUN_CAUSES
from toolseam.seam.protocol import BuiltinExec, WorkspaceTransfer


def _coroutines(protocol: type) -> set[str]:
    return {name for name, value in vars(protocol).items()
            if not name.startswith("_") and inspect.iscoroutinefunction(value)}


def test_every_coroutine_of_the_forwarded_protocols_is_one_row() -> None:
    expected = set().union(*(_coroutines(p) for p in (*ops.REQUIRED, *ops.OPTIONAL)))
    assert expected >= ops.CLIENT_OWN  # what is no request is named, not left out unseen
    expected -= ops.CLIENT_OWN
    assert [op.name for op in ops.TABLE] == list(ops.BY_NAME) and set(ops.BY_NAME) == expected
    assert {op.name for op in ops.TABLE if op.shape != "call"} == {
        "start", "upload", "download", "open_egress", "snapshot_files", "restore_files",
        "resource_usage"}


async def _unused(*args: object) -> Any:
    raise AssertionError("no call is made at construction")


def test_the_client_class_has_the_hosted_kinds_capabilities() -> None:
    held = ops.declared_capabilities(HostBackend)
    assert held == {"WorkspaceTransfer", "InteractiveProcesses", "Egress", "Branching",
                    "ResourceUsage", "DurableSessions", "SandboxKill"}  # the last two as requests
    full, bare = remote_class(held), remote_class(frozenset())
    for name in ops.BY_NAME:
        method = getattr(full, name)
        declared = getattr(ops.BY_NAME[name].capability, name)
        assert inspect.signature(method) == inspect.signature(declared)
        assert method.__doc__ == declared.__doc__
    assert remote_class(held) is full  # one class per set: a capability is the class's fact
    made = {"transport": LoopbackTransport(_unused, _unused), "hosted": HostedSpec(kind="host")}
    probe, none = RemoteBackend(**made), bare(**made)
    assert type(probe) is full and type(none) is bare
    assert supports(probe, WorkspaceTransfer) and supports(probe, InteractiveProcesses)
    assert isinstance(none, BuiltinExec)
    assert not supports(none, WorkspaceTransfer) and not hasattr(none, "pty_start")
    assert hasattr(probe, "open_egress") and not hasattr(none, "open_egress")
    # Branching's synchronous three are the client's own, there only with the capability
    assert supports(probe, Branching) and supports(probe, ResourceUsage)
    # durable sessions cross as requests of the lifetime, not rows; declared as the hosted kind
    assert supports(probe, DurableSessions) and not supports(none, DurableSessions)
    assert not {"detach", "keep_state", "keep_backend_state"} & set(ops.BY_NAME)
    assert all(hasattr(probe, name) and not hasattr(none, name)
               for name in ("branch_backend", "branch_home", "home_stamps", "kill_sandbox",
                            *ops.CLIENT_OWN))
    # the node's own engine (placed): what every local kind declares, decision 493
    assert expected_capabilities(PLACED) == held


HOST_ERRORS = [found for module in (errors, interactive) for found in vars(module).values()
               if isinstance(found, type) and issubclass(found, errors.HostError)]
words = st.text(max_size=40)


@given(st.sampled_from(HOST_ERRORS), words)
def test_a_host_error_crosses_as_itself(kind: type[errors.HostError], message: str) -> None:
    back = map_seam_error(loads(dumps(error_answer(kind(message)))))
    assert type(back) is kind and str(back) == message


@given(words, st.booleans(), st.sampled_from(COULD_NOT_RUN_CAUSES))
def test_could_not_run_keeps_its_cause(reason: str, retryable: bool, cause: str) -> None:
    back = map_seam_error(error_answer(errors.CouldNotRunError(reason, retryable, cause)))  # type: ignore[arg-type]
    assert isinstance(back, errors.CouldNotRunError)
    assert (back.reason, back.retryable, back.cause) == (reason, retryable, cause)


@given(words, words, words)
def test_a_file_error_crosses_as_itself(code: str, path: str, detail: str) -> None:
    back = map_seam_error(error_answer(errors.FileOpError(code, path, detail)))
    assert isinstance(back, errors.FileOpError)
    assert (back.code, back.path, back.detail) == (code, path, detail)


def test_an_attach_refusal_keeps_its_reason_and_anything_else_is_a_fault() -> None:
    back = map_seam_error(error_answer(AttachError("in_use", "held elsewhere")))
    assert isinstance(back, AttachError) and back.reason == "in_use"
    fault = map_seam_error(error_answer(KeyError("x")))
    assert isinstance(fault, errors.CouldNotRunError) and fault.cause == "agent_failed"
    # a cause outside the closed set is "other", never taken as given
    odd = map_seam_error({"kind": "could_not_run", "message": "m", "cause": "made-up"})
    assert isinstance(odd, errors.CouldNotRunError) and odd.cause == "other"
