"""Learner checkpoints: everything needed to continue a run as if it had not stopped.

Layout under <run dir>/learner/checkpoints/:

    v00000012/hf/        save_pretrained model + tokenizer: loads with transformers (and vLLM)
    v00000012/ds/        DeepSpeed state: weights, optimizer, scheduler (ZeRO partitions included)
    v00000012/state.json policy version, learner step, stream entries applied by this checkpoint
    v00000012/rng-<rank>.pt  python, numpy, torch (and CUDA) RNG states of each rank
    latest               name of the newest complete checkpoint, replaced atomically

A checkpoint is written into a temporary folder and renamed, and `latest` is replaced only
after that, so a crash mid-save leaves the previous checkpoint in charge. The stream position
is Redis' own (the consumer group's pending list): the learner acknowledges entries after the
checkpoint that contains their effect, and `applied_entry_ids` covers a crash between the
save and the acknowledgement (those entries are acknowledged on restart, not trained again).

With several ranks both functions are collective: every rank writes (and reads back) its own
DeepSpeed partition and RNG state, rank 0 alone writes hf/, state.json and `latest`, and every
rank loads the checkpoint rank 0 picked (learner/learner.py shares the path), so all resume
from the same one. The folder must be on storage every rank sees.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

if TYPE_CHECKING:  # a name only: importing the engine would import DeepSpeed into a driver reading checkpoints
    from learner.engine import PolicyTrainer


@dataclass
class LearnerState:
    """The learner's own counters, saved with every checkpoint."""

    version: int  # policy version of the weights in this checkpoint
    learner_step: int  # optimizer steps taken so far in the run
    groups_trained: int = 0  # task groups trained so far (actors/staleness_admission.py; 0 in older checkpoints)
    applied_entry_ids: list[str] = field(default_factory=list)  # entries whose effect this checkpoint holds


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def save_checkpoint(trainer: PolicyTrainer, tokenizer, root: Path, state: LearnerState, keep: int = 2) -> Path:
    """Write a checkpoint of `trainer` and `state` (collective: every rank calls it)."""
    name = f"v{state.version:08d}"
    final = root / name
    staging = root / f".{name}.tmp"
    rank = trainer.rank
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    _barrier(trainer)
    weights = trainer.full_state_dict()  # collective under ZeRO-3
    trainer.engine.save_checkpoint(str(staging / "ds"), tag="state", save_latest=False)
    torch.save(_rng_state(), staging / f"rng-{rank}.pt")
    if rank == 0:
        trainer.module.save_pretrained(staging / "hf", state_dict=weights)
        tokenizer.save_pretrained(staging / "hf")
        (staging / "state.json").write_text(json.dumps(asdict(state)))
    _barrier(trainer)
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        pointer = root / ".latest.tmp"
        pointer.write_text(name)
        pointer.replace(root / "latest")
        for old in sorted(root.glob("v*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier(trainer)
    return final


def load_checkpoint(trainer: PolicyTrainer, path: Path) -> LearnerState:
    """Restore weights, optimizer, scheduler and RNG states into `trainer`; returns the counters
    (collective: every rank calls it with the same `path`)."""
    load_path, _ = trainer.engine.load_checkpoint(str(path / "ds"), tag="state")
    if load_path is None:
        raise FileNotFoundError(f"checkpoint {path} has no DeepSpeed state under ds/state; it is damaged")
    _set_rng_state(torch.load(path / f"rng-{trainer.rank}.pt", weights_only=False))
    return read_state(path)


def read_state(path: Path) -> LearnerState:
    """The counters a checkpoint folder holds (its state.json), without loading any weights."""
    return LearnerState(**json.loads((path / "state.json").read_text()))


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _barrier(trainer: PolicyTrainer) -> None:
    if trainer.world_size > 1:
        dist.barrier()
