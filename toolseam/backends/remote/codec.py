"""What crosses between a caller and the process hosting its sandbox (a remote server, a Ray
node actor) as bytes, decoded restrictively both ways.

A request (caller → host) and an answer (host → caller) are pickles, because pickling the
seam's models costs nothing measurable next to Ray's own serialization (decision 310). They
are read by ``SeamUnpickler``, which builds builtin values and the seam's wire models only —
never a callable or another class — on the node (a holder of one session's secret cannot make
the actor every session shares run code) and on the caller (a node actor that is not what it
says cannot make the driver run code: issue 44). Pickle rebuilds a model without validating
it, so every model is validated again after decoding (``checked``): a ``SpawnRequest`` with
``deadline_ms=-1`` is refused as pydantic refuses it anywhere else.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from pydantic import BaseModel

from ...seam import interactive, models, protocol

# The classes a pickle may name: the seam's wire models (its interactive ones included), and
# the raw exec API's request.
_ALLOWED: dict[tuple[str, str], type[BaseModel]] = {
    **{(module.__name__, name): found for module in (models, interactive)
       for name, found in vars(module).items()
       if isinstance(found, type) and issubclass(found, BaseModel)
       and found.__module__ == module.__name__},
    (protocol.__name__, "ExecRequest"): protocol.ExecRequest,
}
MAX_DEPTH = 64  # a decoded value nested deeper is not one of ours
# A request into the node actor (which every session of its node shares) is at most this big:
# the largest is a write's data; workspaces travel through Ray's object store, not as frames.
MAX_REQUEST = 64 << 20
MAX_ANSWER = 512 << 20  # an answer to a caller (a command's capture, a file read whole)


class SeamUnpickler(pickle.Unpickler):
    """Builtin values and the seam's wire models only: no callable, no other class."""

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} is not a seam model")
        return found


def dumps(value: Any) -> bytes:
    return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)


def loads(body: bytes) -> Any:
    """The value ``body`` holds, every model in it validated; ``pickle.UnpicklingError`` for a
    class that is not a seam model, a model that does not validate or a value nested too deep."""
    value = SeamUnpickler(io.BytesIO(body)).load()
    try:
        return checked(value)
    except Exception as exc:  # noqa: BLE001 - whatever a crafted state breaks: not a seam value
        raise pickle.UnpicklingError(f"not a valid seam value ({type(exc).__name__}: "
                                     f"{str(exc)[:200]})") from None


_SCALARS = (str, bytes, int, float, bool, type(None))


def checked(value: Any, depth: int = 0) -> Any:
    """``value`` with every model in it built again through its validators (pydantic does not
    validate a model instance given as a field's value again, so each model is dumped and
    validated whole: 3x faster than rebuilding it field by field, measured)."""
    if isinstance(value, _SCALARS):
        return value
    if depth > MAX_DEPTH:
        raise TypeError(f"nested deeper than {MAX_DEPTH}")
    if isinstance(value, BaseModel):
        return type(value).model_validate(value.model_dump(round_trip=True, warnings=False))
    if isinstance(value, tuple):
        return tuple(checked(item, depth + 1) for item in value)
    if isinstance(value, list):
        return [checked(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {checked(key, depth + 1): checked(item, depth + 1) for key, item in value.items()}
    if isinstance(value, set | frozenset):
        return type(value)(checked(item, depth + 1) for item in value)
    return value
