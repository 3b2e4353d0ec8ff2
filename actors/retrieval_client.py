"""The actors' side of step-level retrieval: one batched Serve call per tick, never a stall.

All of a worker's environments that are about to act ask in the same event-loop tick, so
their observations go to the library's Ray Serve app in one `retrieve_batch` call. A slow or
absent library costs at most `timeout_s`: the step goes ahead without experiences and the miss
is counted.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from actors.batching import MicroBatcher
from actors.prompts import Experience
from monitoring.metrics import metric
from slea.channels import LIBRARY_APP

HANDLE_RETRY_S = 5.0


@dataclass
class Retrieved:
    """What one step got from the library."""

    experiences: list[Experience] = field(default_factory=list)  # ranked, within the token budget
    library_version: int = -1  # version answered from (-1: no answer)
    hit: bool = False  # the library answered in time
    cluster_id: str = ""  # the library's cluster of the observation ("" before warm-up or on a miss)


@dataclass(frozen=True)
class RetrievalQuery:
    observation: str  # the current anchor observation
    task_type: str  # library clusters are per task type
    mode: str  # "step" or "task"


class RetrievalClient:
    def __init__(self, *, k_strategies: int, k_warnings: int, max_tokens: int, timeout_s: float,
                 max_batch: int = 64, app_name: str = LIBRARY_APP, handle=None):
        self.k_strategies, self.k_warnings, self.max_tokens = k_strategies, k_warnings, max_tokens
        self.timeout_s = timeout_s
        self.app_name = app_name
        self._handle = handle
        self._next_handle_try = 0.0
        self._batcher: MicroBatcher[RetrievalQuery, Retrieved] = MicroBatcher(self._retrieve_batch, max_batch)
        self.misses = 0
        self.busy_s = 0.0  # wall time of batched calls (they run one at a time per worker)

    async def retrieve(self, observation: str, task_type: str, mode: str = "step") -> Retrieved:
        return await self._batcher.submit(RetrievalQuery(observation, task_type, mode))

    def _get_handle(self):
        if self._handle is None and time.monotonic() >= self._next_handle_try:
            from ray import serve

            try:
                self._handle = serve.get_app_handle(self.app_name)
            except Exception:  # not deployed (yet): retry later, meanwhile every step is a miss
                self._next_handle_try = time.monotonic() + HANDLE_RETRY_S
        return self._handle

    async def _retrieve_batch(self, queries: list[RetrievalQuery]) -> list[Retrieved]:
        started = time.perf_counter()
        handle = self._get_handle()
        answers = None
        if handle is not None:
            request = {
                "observations": [q.observation for q in queries], "task_types": [q.task_type for q in queries],
                "k_strategies": self.k_strategies, "k_warnings": self.k_warnings, "max_tokens": self.max_tokens,
                "mode": queries[0].mode,
            }
            try:
                answers = await asyncio.wait_for(handle.retrieve_batch.remote(request), timeout=self.timeout_s)
            except Exception as exc:  # timeout, replica down, bad answer: go ahead without experiences
                reason = "timeout" if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) else "error"
                metric("actor_retrieval_misses_total").labels(reason=reason).inc(len(queries))
        else:
            metric("actor_retrieval_misses_total").labels(reason="unavailable").inc(len(queries))
        elapsed = time.perf_counter() - started
        self.busy_s += elapsed
        metric("actor_retrieval_seconds").observe(elapsed)
        if answers is None:
            self.misses += len(queries)
            return [Retrieved() for _ in queries]
        return [
            Retrieved(
                experiences=[Experience(item["experience_id"], item["zone"], item["text"]) for item in answer["experiences"]],
                library_version=int(answer["library_version"]), hit=True, cluster_id=answer.get("cluster_id") or "",
            )
            for answer in answers
        ]

    def close(self) -> None:
        self._batcher.close()
