"""The janitor and a durable session being closed by a live client (copy mode): the client marks
the session closing, then stops the container, then copies its work home. A janitor of another
session on the same engine that listed the markers before the mark, and looked at the container
after the stop, took it for a session that ended by itself and removed it under the copy-back
(seen in the CI rehearsal: `test_killed_client_leaves_a_session_another_process_continues`).
An engine of dicts stands in for the engine here: the race is in the order of the janitor's
questions, which no real engine can be made to interleave on demand."""

from __future__ import annotations

import pytest

from toolseam.backends.containers import janitor as janitor_module
from toolseam.backends.containers.engine.protocol import ContainerState
from toolseam.backends.containers.labels import (
    CLOSING_LABEL,
    DURABLE_LABEL,
    OWNER_LABEL,
    SESSION_LABEL,
    owner_label,
)

SESSION = "s-closing"


class MarkingMidway:
    """The client marks the session closing right after the janitor's first look at volumes."""

    def __init__(self) -> None:
        self.volume_looks = 0
        self.removed: list[str] = []

    def labeled_volumes(self, label: str) -> list[tuple[str, dict[str, str]]]:
        if label != OWNER_LABEL:
            return []
        self.volume_looks += 1
        if self.volume_looks == 1:
            return []  # not marked yet
        return [("toolseam-closing-x", {CLOSING_LABEL: "1", OWNER_LABEL: owner_label(),
                                        SESSION_LABEL: SESSION})]

    def labeled(self, label: str) -> list[tuple[str, dict[str, str]]]:
        if label == DURABLE_LABEL:
            return [("c-durable", {DURABLE_LABEL: "1", SESSION_LABEL: SESSION})]
        return []

    def state(self, container: str) -> ContainerState:
        return ContainerState(running=False, exit_code=0, oom_killed=False, status="exited")

    def remove(self, container: str) -> None:
        self.removed.append(container)

    def remove_volume(self, volume: str) -> None:
        self.removed.append(volume)


def test_a_container_stopped_after_the_mark_is_spared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(janitor_module, "sweep_dead_pools", lambda: [])
    monkeypatch.setattr(janitor_module, "sweep_socket_dirs", lambda: [])
    engine = MarkingMidway()
    janitor_module.janitor(engine)  # type: ignore[arg-type]
    assert "c-durable" not in engine.removed
    assert engine.removed == []
