"""The actors' side of step-level retrieval: one batched Serve call per tick, never a stall.

All of a worker's environments that are about to act ask in the same event-loop tick, so
their observations go to the library's Ray Serve app in one `retrieve_batch` call. A slow or
absent library costs at most `timeout_s`: the step goes ahead without experiences.

Every observation asked about is counted by outcome in `actor_retrieval_requests_total`: hit
(answered with experiences), empty (answered with none), timeout, error (the call raised or the
answer was malformed) or unavailable (no app handle, or an app with no library published yet).
Errors and an unavailable app are also logged with their reason, at most once per reason per
`LOG_WINDOW_S`, so a broken library is loud without flooding the worker's log. An unavailable
library is asked again only after `HANDLE_RETRY_S`, so neither side logs a failed call per step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from actors.batching import MicroBatcher
from actors.log_limiter import LogLimiter
from actors.prompts import Experience
from monitoring.metrics import metric
from slea.channels import LIBRARY_APP, LibraryNotPublished

HANDLE_RETRY_S = 5.0
LOG_WINDOW_S = 30.0  # at most one log line per failure reason per window

log = logging.getLogger(__name__)


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
    def __init__(
        self,
        *,
        k_strategies: int,
        k_warnings: int,
        max_tokens: int,
        timeout_s: float,
        max_batch: int = 64,
        app_name: str = LIBRARY_APP,
        handle=None,
    ):
        self.k_strategies, self.k_warnings, self.max_tokens = k_strategies, k_warnings, max_tokens
        self.timeout_s = timeout_s
        self.app_name = app_name
        self._handle = handle
        self._next_handle_try = 0.0  # monotonic time before which the app is not asked again (unavailable)
        self._batcher: MicroBatcher[RetrievalQuery, Retrieved] = MicroBatcher(self._retrieve_batch, max_batch)
        self.misses = 0  # observations answered without experiences for want of an answer (timeout, error, unavailable)
        self._failures = LogLimiter(log, LOG_WINDOW_S)
        self.busy_s = 0.0  # wall time of batched calls (they run one at a time per worker)

    async def retrieve(self, observation: str, task_type: str, mode: str = "step") -> Retrieved:
        return await self._batcher.submit(RetrievalQuery(observation, task_type, mode))

    def _get_handle(self):
        """The app's handle, or None while it is unavailable (not deployed, or no library yet)."""
        if time.monotonic() < self._next_handle_try:
            return None
        if self._handle is None:
            from ray import serve

            try:
                self._handle = serve.get_app_handle(self.app_name)
            except Exception as exc:  # not deployed (yet): retry later, meanwhile every step goes without
                self._unavailable(exc)
        return self._handle

    def _unavailable(self, exc: BaseException) -> None:
        self._next_handle_try = time.monotonic() + HANDLE_RETRY_S
        self._failures.warning(
            "unavailable",
            f"library app '{self.app_name}' unavailable ({_reason(exc)[1]}); steps go ahead without experiences",
        )

    async def _retrieve_batch(self, queries: list[RetrievalQuery]) -> list[Retrieved]:
        started = time.perf_counter()
        handle = self._get_handle()
        results, outcome = None, "unavailable"
        if handle is not None:
            request = {
                "observations": [q.observation for q in queries],
                "task_types": [q.task_type for q in queries],
                "k_strategies": self.k_strategies,
                "k_warnings": self.k_warnings,
                "max_tokens": self.max_tokens,
                "mode": queries[0].mode,
            }
            try:
                answers = await asyncio.wait_for(handle.retrieve_batch.remote(request), timeout=self.timeout_s)
                results = _parse(answers, len(queries))
            except TimeoutError:  # asyncio.TimeoutError is TimeoutError since Python 3.11
                outcome = "timeout"
            except Exception as exc:  # replica raised or died, malformed answer: go ahead without experiences
                if isinstance(_cause(exc), LibraryNotPublished):  # the app is up, its library not yet
                    outcome = "unavailable"
                    self._unavailable(exc)
                else:
                    outcome = "error"
                    kind, reason = _reason(exc)
                    self._failures.warning(
                        f"error:{kind}",
                        f"library retrieval failed ({reason}); {len(queries)} step(s) went ahead without experiences",
                    )
        elapsed = time.perf_counter() - started
        self.busy_s += elapsed
        metric("actor_retrieval_seconds").observe(elapsed)
        requests = metric("actor_retrieval_requests_total")
        if results is None:
            requests.labels(outcome=outcome).inc(len(queries))
            self.misses += len(queries)
            return [Retrieved() for _ in queries]
        hits = sum(1 for result in results if result.experiences)
        requests.labels(outcome="hit").inc(hits)
        requests.labels(outcome="empty").inc(len(results) - hits)
        return results

    def close(self) -> None:
        self._batcher.close()


def _parse(answers, expected: int) -> list[Retrieved]:
    """The app's answers as Retrieved, one per query; a wrong count or shape raises (an error outcome)."""
    if not isinstance(answers, list) or len(answers) != expected:
        got = f"{len(answers)} answers" if isinstance(answers, list) else type(answers).__name__
        raise ValueError(f"retrieve_batch answered {got} for {expected} observations")
    return [
        Retrieved(
            experiences=[
                Experience(item["experience_id"], item["zone"], item["text"]) for item in answer["experiences"]
            ],
            library_version=int(answer["library_version"]),
            hit=True,
            cluster_id=answer.get("cluster_id") or "",
        )
        for answer in answers
    ]


def _cause(exc: BaseException) -> BaseException:
    """What went wrong: a replica's exception reaches the caller wrapped in a RayTaskError whose
    text is the whole remote traceback; its cause is the replica's own exception."""
    from ray.exceptions import RayTaskError

    return exc.cause if isinstance(exc, RayTaskError) and exc.cause is not None else exc


def _reason(exc: BaseException) -> tuple[str, str]:
    """(exception type name, 'type: first line of its message') of what went wrong."""
    exc = _cause(exc)
    kind, lines = type(exc).__name__, str(exc).strip().splitlines()
    return kind, f"{kind}: {lines[0][:200]}" if lines else kind
