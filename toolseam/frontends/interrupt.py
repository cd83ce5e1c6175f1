"""``asyncio.run`` that a Ctrl-C always reaches.

``asyncio.run`` catches SIGINT with ``signal.signal`` alone, and that wakes an idle loop only
when the kernel delivers the signal to the main thread. In a process with threads (the live
table's, an executor's) it may land on another: the main thread then slept on in ``epoll_wait``
and ``toolseam serve --stdio`` ignored Ctrl-C until its stdin closed (CI saw it under load; a
``tgkill`` to another thread showed it every time). ``loop.add_signal_handler`` also sets the
signal wake-up descriptor, so the loop wakes wherever the signal lands.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["run_interruptible"]


def run_interruptible(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` as ``asyncio.run`` does; SIGINT cancels it (its cleanup runs) and then
    raises ``KeyboardInterrupt``, as a Ctrl-C under ``asyncio.run`` is meant to."""
    return asyncio.run(_cancelled_on_sigint(main))


async def _cancelled_on_sigint(main: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        if interrupted:  # a second Ctrl-C: do not wait for the cleanup
            raise KeyboardInterrupt
        interrupted = True
        task.cancel()

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        return await main
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)
