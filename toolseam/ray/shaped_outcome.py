"""What a ref put ahead for a Ray-shaped sandbox's call holds (``shaped_direct.py``): the
call's token, read back (Ray unpickles it in the reading process) as the answer this process
received, or in another process as the node's kept outcome. The node side makes these
(``node_shaped_direct.py``); reading one only finds the node actor, never makes it
(``cluster.found_actor``), so the node side does not import what makes actors.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from . import cluster

ANSWERS_KEPT = 1024  # answers this process keeps for its refs (then the node's copy is read)
_lock = threading.Lock()
_answers: OrderedDict[str, Any] = OrderedDict()  # token -> the answer this process received


def answered(token: str, value: Any) -> None:
    """The answer this process received for the call ``token``."""
    with _lock:
        _answers[token] = value
        while len(_answers) > ANSWERS_KEPT:
            _answers.popitem(last=False)


def _outcome_of(node_id: str, sandbox_id: str, secret: str, token: str) -> Any:
    """What a ref put ahead reads as (its unpickling, in the process reading it)."""
    with _lock:
        if token in _answers:
            return _answers[token]
    ray = cluster.ray_module()
    actor = cluster.found_actor(ray, node_id)
    return ray.get(actor.sb_collect.remote(sandbox_id, secret, token))


@dataclass(frozen=True)
class Outcome:
    """The value a ref put ahead holds: which call of which sandbox (its secret included —
    only a holder of the sandbox gets such a ref, as it gets the sandbox itself)."""

    node_id: str
    sandbox_id: str
    secret: str
    token: str

    def __reduce__(self) -> tuple[Any, tuple[str, str, str, str]]:
        return (_outcome_of, (self.node_id, self.sandbox_id, self.secret, self.token))

    def __repr__(self) -> str:  # never the secret
        return f"Outcome({self.token[:8]}…)"
