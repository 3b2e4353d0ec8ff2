"""Where a run's metrics go besides metrics.jsonl: TensorBoard and Weights & Biases.

metrics.jsonl is the run's record (RunRecorder writes it; plots, `slea compare` and --resume read
it). The sinks here are views of the same lines for live inspection, chosen by
`monitoring.sinks`; each gets every learner step's numeric metrics, keyed as in metrics.jsonl.

A held-out evaluation reports its step after the learner has moved on, and a resumed run redoes
the steps after its last checkpoint, so a sink must accept a step that is not the newest:
TensorBoard does; W&B plots against its own `learner_step` metric for that reason (its built-in
step only grows).
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Protocol

from slea.config import ConfigError, SleaConfig

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"  # wandb.init(dir=run_dir) writes its files here
WANDB_RUN_ID_FILE = "slea-run-id"  # inside WANDB_DIR: the W&B run id a --resume continues
WANDB_STEP = "learner_step"


class MetricSink(Protocol):
    def record(self, step: int, metrics: dict[str, float], walltime: float) -> None:
        """One learner step's numeric metrics ('actors/success_rate' -> 0.25), at Unix time `walltime`."""

    def close(self) -> None:
        """Flush and release; the run is over (or stopping, to be resumed)."""


class TensorBoardSink:
    """Scalars in <run dir>/tensorboard/ (`tensorboard --logdir runs/`)."""

    def __init__(self, run_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(Path(run_dir) / TENSORBOARD_DIR))

    def record(self, step: int, metrics: dict[str, float], walltime: float) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step, walltime=walltime)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """One W&B run per run directory, named after the run id, with the resolved config attached.

    Its W&B id (`<run id>-<random>`, so a new run that reuses a run id never appends to an old W&B
    run) is kept in <run dir>/wandb/slea-run-id: `slea train --resume` continues the same W&B run.
    Offline, each start writes <run dir>/wandb/offline-run-*-<id>/ and `wandb sync` uploads them."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        name: str,
        project: str,
        entity: str | None = None,
        mode: str | None = None,
        config: dict | None = None,
    ):
        import wandb

        files = Path(run_dir) / WANDB_DIR
        files.mkdir(parents=True, exist_ok=True)
        id_file = files / WANDB_RUN_ID_FILE
        if not id_file.is_file():  # W&B ids allow letters, digits, '.', '_', '-': any other character becomes '-'
            id_file.write_text(f"{re.sub(r'[^A-Za-z0-9._-]', '-', name)[:48]}-{secrets.token_hex(4)}\n")
        self.run_id = id_file.read_text().strip()
        try:
            self._run = wandb.init(
                project=project,
                entity=entity,
                name=name,
                id=self.run_id,
                resume="allow",
                dir=str(run_dir),
                mode=mode,
                config=config,
            )
        except wandb.errors.UsageError as exc:  # online without credentials, mostly
            raise ConfigError(
                f"monitoring.sinks lists wandb, and W&B refused to start the run: {exc} "
                "(or set monitoring.wandb_mode: offline to log without an account, for `wandb sync` later)"
            ) from None
        self._run.define_metric(WANDB_STEP)
        self._run.define_metric("*", step_metric=WANDB_STEP)

    def record(self, step: int, metrics: dict[str, float], walltime: float) -> None:
        self._run.log({**metrics, WANDB_STEP: step})

    def close(self) -> None:
        self._run.finish()


def open_sinks(config: SleaConfig, run_dir: str | Path) -> list[MetricSink]:
    """The sinks `monitoring.sinks` names, besides jsonl (the recorder's own)."""
    monitoring = config.monitoring
    sinks: list[MetricSink] = []
    if "tensorboard" in monitoring.sinks:
        sinks.append(TensorBoardSink(run_dir))
    if "wandb" in monitoring.sinks:
        sinks.append(
            WandbSink(
                run_dir,
                name=config.run.id,
                project=monitoring.wandb_project,
                entity=monitoring.wandb_entity,
                mode=monitoring.wandb_mode,
                config=config.model_dump(mode="json"),
            )
        )
    return sinks
