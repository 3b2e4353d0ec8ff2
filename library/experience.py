"""What the library stores: experiences in two zones with three levels each, and the candidates
that extraction proposes for admission.

E+ (strategy zone) holds what worked: principles (general rules), methods (procedures) and
examples (concrete action sequences). E- (warning zone) holds what failed: mistakes (one wrong
action), patterns (recurring failure behaviour) and diagnostics (why an episode failed).
"""

from __future__ import annotations

import base64
import time
from dataclasses import asdict, dataclass, field

import numpy as np

STRATEGY = "strategy"
WARNING = "warning"
LEVELS = {STRATEGY: ("principle", "method", "example"), WARNING: ("mistake", "pattern", "diagnostic")}


def encode_vector(vector: np.ndarray) -> str:
    """float32 vector -> base64 text (snapshots and deltas stay JSON, vectors stay exact)."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")


def decode_vector(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4").copy()


@dataclass
class Candidate:
    """One lesson an extractor distilled from an episode, before admission decides its fate."""

    zone: str  # STRATEGY or WARNING
    level: str  # one of LEVELS[zone]
    content: str  # the lesson, one or two sentences
    cue: str  # the state it applies to, in words ("a closed drawer is in view")
    task_type: str  # task type of the source episode; retrieval never crosses task types
    trigger_observations: list[str]  # anchor observations of the steps it applies to -> its clusters
    score: float  # admission priority: how good the success / how bad the failure was
    source_episode_ids: list[str]  # episodes it was distilled from
    avoid_action: str = ""  # warnings: the action not to take
    instead_action: str = ""  # warnings: the action to take instead ("" if unknown)

    def text(self) -> str:
        """The line a prompt shows: the lesson plus, for warnings, what to avoid and do instead."""
        parts = [self.content.strip()]
        if self.avoid_action:
            parts.append(f"Avoid: {self.avoid_action}.")
        if self.instead_action:
            parts.append(f"Instead: {self.instead_action}.")
        return " ".join(parts)


@dataclass
class Experience:
    """One admitted lesson; the unit of retrieval, admission, utility and pruning."""

    id: str  # stable id, e.g. "x17"; recorded in StepRecord.experience_ids when injected
    zone: str  # STRATEGY or WARNING
    level: str  # one of LEVELS[zone]; capacities are per level
    task_type: str  # retrieval and dedup stay within one task type
    text: str  # what the prompt shows (Candidate.text())
    cue: str  # the state it applies to, in words
    clusters: list[str]  # trigger: ids of the observation clusters it is indexed to
    score: float  # admission score; replace-the-minimum compares it
    tokens: int  # length of `text` in budget tokens (embedding tokenizer)
    embedding: np.ndarray  # float32 [dim], unit vector of cue + text; dedup and fallback compare it
    utility: float = 0.0  # EDGE utility: exponential average of its per-window A/B gain (admission.utility_evidence)
    exposures: int = 0  # episodes it was injected into
    compared: int = 0  # treated A-half episodes of A/B groups that gave it a matched gain: the sample behind `utility`
    low_windows: int = 0  # consecutive windows with A/B evidence whose utility ended at or below the prune threshold
    usage: int = 0  # steps it was injected into
    source_episode_ids: list[str] = field(default_factory=list)  # episodes it was distilled or merged from
    created_at: float = field(default_factory=time.time)  # unix seconds of admission
    created_version: int = 0  # library version that admitted it

    def rank_key(self) -> float:
        """Retrieval order within a cluster: admission score plus what injection has shown."""
        return self.score + self.utility

    def to_json(self) -> dict:
        record = asdict(self)
        record["embedding"] = encode_vector(self.embedding)
        return record

    @classmethod
    def from_json(cls, record: dict) -> Experience:
        return cls(**{**record, "embedding": decode_vector(record["embedding"])})
