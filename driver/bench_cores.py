"""`slea bench cores`: what the learner and an actor lose when they compute on the same cores at once,
and which setting takes the loss away.

In asynchronous training the learner's update and an actor's generation run at the same time on one
machine's cores; in the synchronous baseline they take turns, each with every core. Overlapping pays
only if the two together get more work done than taking turns would: `overlap_gain`, the sum of
each one's throughput beside the other as a fraction of its throughput alone with every core, must
be above 1 (at 1 the overlapped run is as fast as the alternating one; below, slower).

Each workload runs in its own process, as in `slea train`: the learner a forward and backward of the
policy with fused AdamW on 4 x 256 tokens (loss on the last 16 positions), the actor `generate` of
16 sampled tokens for 4 prompts of 300 tokens. First each alone with every core (the synchronous
phases), then together under each setting:

- `default`: the learner with every core, the actor with one, libgomp's default wait (a waiting
  thread spins ~300k iterations before it sleeps), as before this benchmark;
- `passive`: the same threads, OMP_WAIT_POLICY=PASSIVE (what `slea train` now gives every worker);
- `split`: the learner with every core but one, the actor with one: no core has two threads.

The processes load the model first and start measuring together; each reports its rate over the
same `seconds`. Alone, the wait policy changes nothing measurable (learner 133.5 tokens/s passive,
134.7 default on the 2-core machine), so the alone runs use the passive policy of `slea train`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slea.cpu_threads import WAIT_POLICY
from slea.models import SHIPPED

DEFAULT_MODEL = SHIPPED
LEARNER_BATCH = (4, 256)  # sequences x tokens per optimizer step
LOSS_POSITIONS = 16  # positions the loss reads (a response's tokens)
ACTOR_PROMPTS = (4, 300)  # prompts x prompt tokens per generate call
ACTOR_NEW_TOKENS = 16


def _workload(role: str, model_name: str):
    """(one unit of work, tokens it processes): the learner's optimizer step or the actor's generate call."""
    import torch

    from slea.models import load_model

    model, _ = load_model(model_name)
    torch.manual_seed(0)
    vocab = model.config.vocab_size
    if role == "learner":
        ids = torch.randint(0, vocab, LEARNER_BATCH)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)

        def step() -> int:
            logits = model(input_ids=ids).logits[:, -LOSS_POSITIONS:].float()
            logits.logsumexp(-1).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            return ids.numel()

        return step
    model.eval()
    prompts = torch.randint(0, vocab, ACTOR_PROMPTS)

    def generate() -> int:
        with torch.no_grad():
            model.generate(
                input_ids=prompts,
                attention_mask=torch.ones_like(prompts),
                max_new_tokens=ACTOR_NEW_TOKENS,
                min_new_tokens=ACTOR_NEW_TOKENS,
                do_sample=True,
                pad_token_id=0,
            )
        return ACTOR_PROMPTS[0] * ACTOR_NEW_TOKENS

    return generate


def _run_role(role: str, model_name: str, threads: int, seconds: float, out: Path, start_file: Path) -> None:
    """One measuring process: load, warm up, say ready, wait for the start file, work for `seconds`."""
    import torch

    torch.set_num_threads(threads)
    work = _workload(role, model_name)
    work()  # warm-up: first-call allocations and kernel selection
    Path(f"{out}.ready").touch()
    while not start_file.exists():
        time.sleep(0.01)
    started, tokens = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        tokens += work()
    out.write_text(json.dumps({"tokens_per_s": tokens / (time.monotonic() - started)}))


def _measure(roles: dict[str, int], wait_policy: str | None, model_name: str, seconds: float) -> dict[str, float]:
    """Tokens/s of each role in `roles` (role -> torch threads), all running at once."""
    env = {name: value for name, value in os.environ.items() if name != WAIT_POLICY}
    if wait_policy is not None:
        env[WAIT_POLICY] = wait_policy
    with tempfile.TemporaryDirectory(prefix="slea-bench-cores-") as tmp:
        start_file = Path(tmp) / "start"
        outs = {role: Path(tmp) / f"{role}.json" for role in roles}
        processes = [
            subprocess.Popen(
                [sys.executable, "-m", __name__, role, model_name, str(threads), str(seconds), str(outs[role]), tmp],
                env=env,
                stdout=sys.stderr,
            )
            for role, threads in roles.items()
        ]
        try:
            while not all(Path(f"{out}.ready").exists() for out in outs.values()):
                if any(process.poll() not in (None, 0) for process in processes):
                    raise RuntimeError("a measuring process failed while loading; its output is above")
                time.sleep(0.05)
            start_file.touch()
            for process in processes:
                if process.wait(timeout=seconds + 600) != 0:
                    raise RuntimeError(f"a measuring process exited with {process.returncode}; its output is above")
        finally:
            for process in processes:
                process.kill()
        return {role: round(json.loads(out.read_text())["tokens_per_s"], 2) for role, out in outs.items()}


def overlap_gain(together: dict[str, float], alone: dict[str, float]) -> float:
    """Sum over the roles of (tokens/s beside the others) / (tokens/s alone with every core)."""
    return sum(together[role] / alone[role] for role in together)


def bench_cores(model_name: str = DEFAULT_MODEL, seconds: float = 40.0) -> dict:
    """Every role alone, then together under each setting, with each setting's overlap gain."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        raise RuntimeError("slea bench cores compares sharing cores with splitting them: it needs at least 2 cores")
    alone = {role: _measure({role: cores}, "PASSIVE", model_name, seconds)[role] for role in ("learner", "actor")}
    settings = {
        "default": ({"learner": cores, "actor": 1}, None),
        "passive": ({"learner": cores, "actor": 1}, "PASSIVE"),
        "split": ({"learner": cores - 1, "actor": 1}, "PASSIVE"),
    }
    result = {"model": model_name, "cores": cores, "seconds": seconds, "alone_tokens_per_s": alone}
    for name, (threads, wait_policy) in settings.items():
        together = _measure(threads, wait_policy, model_name, seconds)
        result[name] = {
            "threads": threads,
            "wait_policy": wait_policy or "libgomp default",
            "tokens_per_s": together,
            "share_of_alone": {role: round(together[role] / alone[role], 3) for role in together},
            "overlap_gain": round(overlap_gain(together, alone), 3),
        }
    return result


if __name__ == "__main__":  # one measuring process (see _measure)
    parser = argparse.ArgumentParser()
    for name in ("role", "model", "threads", "seconds", "out", "tmp"):
        parser.add_argument(name)
    args = parser.parse_args()
    _run_role(args.role, args.model, int(args.threads), float(args.seconds), Path(args.out), Path(args.tmp) / "start")
