"""Gather concurrent requests of one event loop into batches (one engine or library call each)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class MicroBatcher(Generic[Item, Result]):
    """`await batcher.submit(item)`: items submitted in the same event-loop tick (and while the
    previous batch runs) go to `run_batch` together, up to `max_batch` at a time."""

    def __init__(self, run_batch: Callable[[list[Item]], Awaitable[list[Result]]], max_batch: int):
        self.run_batch = run_batch
        self.max_batch = max_batch
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None

    async def submit(self, item: Item) -> Result:
        if self._task is None or self._task.done():
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._loop())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((item, future))
        return await future

    async def _loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(0)  # let every caller that is ready this tick enqueue
            while not self._queue.empty() and len(batch) < self.max_batch:
                batch.append(self._queue.get_nowait())
            try:
                results = await self.run_batch([item for item, _future in batch])
            except Exception as exc:  # every waiting caller gets the failure; the loop lives on
                for _item, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_item, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
