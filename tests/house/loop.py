"""An asyncio event loop on a virtual clock, and per-host task groups a crash can cancel.

The loop never waits: when nothing is ready it jumps its time to the next timer, so every
asyncio.sleep, wait_for and call_later of the real daemon code runs in virtual seconds, in a
deterministic order (same inputs, same interleaving). Tasks created while a host's context is
current belong to that host; `cancel_host` ends them all, as a crash ends a process.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
from typing import Any

HOST: contextvars.ContextVar[str | None] = contextvars.ContextVar("house_host", default=None)


class Deadlock(RuntimeError):
    """Nothing is ready and no timer is set: the simulated world stopped."""


class _Selector(selectors.BaseSelector):
    """No I/O: select() moves the loop's clock by the timeout instead of waiting."""

    def __init__(self, loop: VirtualLoop) -> None:
        self._loop = loop
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, fileobj if isinstance(fileobj, int) else fileobj.fileno(), events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list:
        if timeout is None:
            raise Deadlock("no task is ready and no timer is set")
        if timeout > 0:
            self._loop.advance(timeout)
        return []

    def get_map(self) -> dict:
        return self._map

    def close(self) -> None:
        self._map.clear()


class VirtualLoop(asyncio.SelectorEventLoop):
    """See the module docstring."""

    def __init__(self) -> None:
        super().__init__(_Selector(self))
        self._now = 0.0
        self.tasks_of: dict[str, dict[asyncio.Task, None]] = {}  # a dict, not a set: a crash cancels in creation order
        self.errors: list[str] = []
        self.set_task_factory(self._factory)
        self.set_exception_handler(self._on_error)

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock (only the selector does, when the loop would wait)."""
        self._now += seconds

    def _factory(self, loop: asyncio.AbstractEventLoop, coro: Any, context: contextvars.Context | None = None) -> asyncio.Task:
        task = asyncio.Task(coro, loop=loop, context=context)
        host = context.get(HOST) if context is not None else HOST.get()
        if host is not None:
            tasks = self.tasks_of.setdefault(host, {})
            tasks[task] = None
            task.add_done_callback(lambda t: tasks.pop(t, None))
        return task

    def _on_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, asyncio.CancelledError):
            return
        self.errors.append(f"{context.get('message')}: {type(exc).__name__ if exc else ''} {exc or ''}".strip())

    @staticmethod
    def context_of(host: str) -> contextvars.Context:
        """A fresh context whose tasks belong to `host`."""
        ctx = contextvars.copy_context()
        ctx.run(HOST.set, host)
        return ctx

    async def cancel_host(self, host: str) -> None:
        """Cancel every task of host and wait until they have ended."""
        tasks = [t for t in self.tasks_of.pop(host, {}) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
