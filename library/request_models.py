"""Retrieval requests as the Serve app accepts them: types, sizes, and k and token bounds.

Shared by the handle methods and the HTTP routes, so both reject the same things with the
same messages. Static bounds live in the models; the ones a run configures (observation
length, batch size) are checked against the LibraryConfig.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from slea.config import LibraryConfig


class BadRequest(ValueError):
    """A request the library will not answer; `status` is the HTTP status to send."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    k_strategies: int = Field(2, ge=0, le=32)
    k_warnings: int = Field(1, ge=0, le=32)
    max_tokens: int = Field(200, ge=1, le=4096)
    mode: Literal["step", "task"] = "step"


class RetrieveRequest(_Request):
    observation: str = Field(min_length=1)
    task_type: str = Field(min_length=1, max_length=200)


class RetrieveBatchRequest(_Request):
    observations: list[str] = Field(min_length=1)
    task_types: list[str] = Field(min_length=1)

    @model_validator(mode="after")
    def _same_length(self):
        if len(self.observations) != len(self.task_types):
            raise ValueError(f"{len(self.observations)} observations but {len(self.task_types)} task_types")
        if any(not text for text in self.observations) or any(not 0 < len(t) <= 200 for t in self.task_types):
            raise ValueError("observations must be non-empty and task_types 1-200 characters")
        return self


def parse_request(model: type[_Request], payload: object, cfg: LibraryConfig) -> _Request:
    """Validate a decoded JSON body (or handle argument); raises BadRequest with a message."""
    if not isinstance(payload, dict):
        raise BadRequest(422, f"request must be a JSON object, got {type(payload).__name__}")
    try:
        request = model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise BadRequest(422, f"{where}: {first['msg']}") from None
    observations = request.observations if isinstance(request, RetrieveBatchRequest) else [request.observation]
    if len(observations) > cfg.max_batch_observations:
        raise BadRequest(413, f"{len(observations)} observations in one request; at most {cfg.max_batch_observations}")
    longest = max(len(text) for text in observations)
    if longest > cfg.max_observation_chars:
        raise BadRequest(413, f"an observation has {longest} characters; at most {cfg.max_observation_chars}")
    return request
