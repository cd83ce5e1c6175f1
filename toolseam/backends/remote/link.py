"""The client's end of one proven byte-stream connection: calls sent by id and answered in any
order, a streamed call's events handed on in order before its answer, a cancelled call
cancelled on the server too. Shared by every stream transport (``unix.py``; a Ray node's
direct port or a pod's port tomorrow)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import pickle

from .codec import dumps, loads
from .frames import MAX_ANSWER, FrameTooLarge, frame, read_frame
from .transport import Answer, OnEvent, Request, TransportLost


class StreamLink:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 where: str) -> None:
        self._reader, self._writer, self._where = reader, writer, where
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[asyncio.Future[Answer], OnEvent | None]] = {}
        self._ended: str | None = None
        self._task = asyncio.ensure_future(self._read())

    @property
    def alive(self) -> bool:
        return self._ended is None

    async def _read(self) -> None:
        why = "went away"
        try:
            while True:
                req, kind, value = loads(await read_frame(self._reader, MAX_ANSWER))
                if req == 0:  # the server refused what this end sent, and hangs up
                    why = f"refused the connection: {value[1].get('message', '')}"
                    continue
                waiting = self._waiting.get(req)
                if waiting is None:
                    continue
                future, on_event = waiting
                if kind == "event" and on_event is not None:
                    on_event(value)
                elif kind == "answer":
                    self._waiting.pop(req, None)
                    if not future.done():
                        future.set_result(value)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the server went away
        except FrameTooLarge as refused:
            why = f"sent what this client refused: {refused}"
        except (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError,
                IndexError) as exc:
            why = f"sent what is not a toolseam answer ({str(exc)[:200]})"
        except OSError:
            pass
        finally:
            self._end(why)

    def _end(self, why: str) -> None:
        if self._ended is None:
            self._ended = f"{self._where} {why}"
        for future, _ in self._waiting.values():
            if not future.done():
                future.set_exception(TransportLost(self._ended))
        self._waiting.clear()
        self._writer.close()

    async def send(self, request: Request, on_event: OnEvent | None) -> Answer:
        if self._ended is not None:
            raise TransportLost(self._ended)
        req = next(self._ids)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting[req] = (future, on_event)
        try:
            self._writer.write(frame(dumps((req, request))))
            await self._writer.drain()  # a large write waits for the server to read it
            return await future
        except ConnectionError:
            self._end("went away")
            raise TransportLost(self._ended or self._where) from None
        except asyncio.CancelledError:
            self._waiting.pop(req, None)
            if self._ended is None and not self._writer.is_closing():
                self._writer.write(frame(dumps((req, None))))  # the server cancels it too
            raise

    async def close(self) -> None:
        self._end("was closed")
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # closing: nothing to say
            await self._task
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
