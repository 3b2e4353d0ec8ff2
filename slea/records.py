"""StepRecord: the one message every component agrees on, and its msgpack codec.

One record per environment step. Token ids and log-probs travel as packed little-endian
int32/float32 byte strings, so an 8k-token prompt is one memcpy on each side instead of 8k
Python ints. Never pickle: the stream is read by processes of other versions and languages.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import msgpack
import numpy as np

SCHEMA_VERSION = 2  # what encode writes; 2 added teacher_prompt_ids
READABLE_VERSIONS = (1, 2)  # what decode accepts: a v1 record is a v2 record without a teacher prompt

_INT32 = np.dtype("<i4")
_FLOAT32 = np.dtype("<f4")


class RecordDecodeError(ValueError):
    """A stream payload that is not a StepRecord this code understands (malformed or unknown schema)."""


def _empty_ids() -> np.ndarray:
    return np.zeros(0, dtype=_INT32)


def _empty_logprobs() -> np.ndarray:
    return np.zeros(0, dtype=_FLOAT32)


@dataclass(eq=False)
class StepRecord:
    """One environment step as an actor played it, tagged with everything the learner and library need."""

    run_id: str  # the run this step belongs to (stream slea:<run_id>:steps)
    task_id: str  # stable id of the task (same for all G trajectories of a group)
    task_type: str  # e.g. "pick_heat_then_place_in_recep"; library and metrics partition by it
    env_name: str  # registry name of the environment, e.g. "alfworld"
    group_id: str  # one task played G times; advantages normalise within it
    episode_id: str  # one trajectory; (episode_id, step) is the idempotency key
    step: int  # 0-based index of this step within its episode
    anchor_obs: str  # raw env observation the action answered (no template, no history)
    anchor_cluster: str = ""  # library cluster id of anchor_obs, retrieved at this step ("" if none)
    prompt_ids: np.ndarray = field(default_factory=_empty_ids)  # int32 [P]: exact prompt tokens generated from
    response_ids: np.ndarray = field(default_factory=_empty_ids)  # int32 [R]: exact sampled tokens
    response_logprobs: np.ndarray = field(default_factory=_empty_logprobs)  # float32 [R]: behaviour log-probs
    action: str = ""  # parsed action text sent to the env ("" if none could be parsed)
    action_valid: bool = True  # parsable and admissible; invalid steps are penalised
    reward: float = 0.0  # env reward of this step
    done: bool = False  # last step of the episode
    success: bool = False  # episode won (meaningful on the last step)
    policy_version: int = 0  # learner version of the weights that generated the response
    library_version: int = -1  # library version retrieved from (-1: no retrieval)
    experience_ids: list[str] = field(default_factory=list)  # experiences injected into the prompt
    step_budget: int = 0  # the episode's step budget (budget-mixed training)
    with_experience: bool = True  # experience-conditioned episode (False in the B half of A/B groups)
    teacher_prompt_ids: np.ndarray = field(default_factory=_empty_ids)  # int32 [P']: B half under EDGE distillation:
    # the same prompt with the experiences retrieved for this step shown (the teacher's context); else empty
    abandoned: bool = False  # marker: the episode was cut off (worker died); drop it, never train on it
    created_at: float = field(default_factory=time.time)  # unix seconds when the actor produced it

    def key(self) -> tuple[str, int]:
        """Idempotency key: a redelivered step has the same key."""
        return self.episode_id, self.step

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepRecord):
            return NotImplemented
        for spec in dataclasses.fields(self):
            mine, theirs = getattr(self, spec.name), getattr(other, spec.name)
            if isinstance(mine, np.ndarray):
                if mine.dtype != theirs.dtype or not np.array_equal(mine, theirs, equal_nan=True):
                    return False
            elif mine != theirs:
                return False
        return True


_ARRAY_FIELDS = {
    "prompt_ids": _INT32,
    "response_ids": _INT32,
    "response_logprobs": _FLOAT32,
    "teacher_prompt_ids": _INT32,
}
_FIELD_NAMES = [spec.name for spec in dataclasses.fields(StepRecord)]
_ADDED_IN = {"teacher_prompt_ids": 2}  # field -> schema version that introduced it (older payloads must not carry it)
_REQUIRED = [
    spec.name
    for spec in dataclasses.fields(StepRecord)
    if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
]


def encode(record: StepRecord) -> bytes:
    """StepRecord -> msgpack bytes (a map with a schema version 'v')."""
    payload: dict[str, object] = {"v": SCHEMA_VERSION}
    for name in _FIELD_NAMES:
        value = getattr(record, name)
        dtype = _ARRAY_FIELDS.get(name)
        if dtype is not None:
            value = np.ascontiguousarray(value, dtype=dtype).tobytes()
        payload[name] = value
    if len(payload["response_ids"]) != len(payload["response_logprobs"]):  # type: ignore[arg-type]
        raise ValueError(
            f"StepRecord {record.episode_id}/{record.step}: {len(record.response_ids)} response ids but "
            f"{len(record.response_logprobs)} log-probs"
        )
    return msgpack.packb(payload, use_bin_type=True)


def decode(blob: bytes) -> StepRecord:
    """msgpack bytes -> StepRecord; anything else raises RecordDecodeError naming the problem."""
    try:
        payload = msgpack.unpackb(blob, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise RecordDecodeError(f"payload is not msgpack: {exc}") from None
    if not isinstance(payload, dict):
        raise RecordDecodeError(f"payload is a {type(payload).__name__}, not a map")
    version = payload.pop("v", None)
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise RecordDecodeError(f"unknown StepRecord schema version {version!r} (this code reads {READABLE_VERSIONS})")
    missing = [name for name in _REQUIRED if name not in payload]
    if missing:
        raise RecordDecodeError(f"payload lacks required fields {missing}")
    unknown = set(payload) - {name for name in _FIELD_NAMES if _ADDED_IN.get(name, 1) <= version}
    if unknown:
        raise RecordDecodeError(f"payload has unknown fields {sorted(unknown)}")
    for name, dtype in _ARRAY_FIELDS.items():
        if name in payload:
            raw = payload[name]
            if not isinstance(raw, bytes) or len(raw) % dtype.itemsize:
                raise RecordDecodeError(f"field '{name}' is not a packed {dtype.name} array")
            payload[name] = np.frombuffer(raw, dtype=dtype)
    try:
        record = StepRecord(**payload)
    except TypeError as exc:
        raise RecordDecodeError(str(exc)) from None
    _check_types(record)
    return record


_SCALAR_TYPES = {
    "run_id": str,
    "task_id": str,
    "task_type": str,
    "env_name": str,
    "group_id": str,
    "episode_id": str,
    "step": int,
    "anchor_obs": str,
    "anchor_cluster": str,
    "action": str,
    "action_valid": bool,
    "reward": (int, float),
    "done": bool,
    "success": bool,
    "policy_version": int,
    "library_version": int,
    "experience_ids": list,
    "step_budget": int,
    "with_experience": bool,
    "abandoned": bool,
    "created_at": (int, float),
}


def _check_types(record: StepRecord) -> None:
    for name, expected in _SCALAR_TYPES.items():
        value = getattr(record, name)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise RecordDecodeError(f"field '{name}' has type {type(value).__name__}")
    if len(record.response_ids) != len(record.response_logprobs):
        raise RecordDecodeError("response_ids and response_logprobs differ in length")
    if not all(isinstance(item, str) for item in record.experience_ids):
        raise RecordDecodeError("field 'experience_ids' must be a list of strings")
