"""Run by the vLLM engine tests in a subprocess (an interpreter with vllm): drive VllmEngine on a
checkpoint, generate, join the test's weight group (the test is the learner, rank 0), receive
the broadcast weights as version 3, generate again, and write both as JSON.

usage: python vllm_collective_probe.py CHECKPOINT_DIR PLAN.json HOST PORT OUT.json
"""

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def main(checkpoint: str, plan_path: str, host: str, port: str, out: str) -> None:
    from vllm_probe import generation_json, probe_engine

    engine, prompts = probe_engine(checkpoint)
    plan = json.loads(Path(plan_path).read_text())

    async def scenario():
        first = await asyncio.gather(*(engine.generate(list(p)) for p in prompts))
        joined = await engine.join_weight_group(host, int(port), 1 + engine.weight_group_size, "gloo", 300.0)
        # A generation asked for during the transfer waits for it and runs on the new weights.
        receive = asyncio.ensure_future(engine.receive_weights(plan, version=3))
        await asyncio.sleep(0)
        second = await asyncio.gather(*(engine.generate(list(p)) for p in prompts))
        await receive
        await engine.leave_weight_group()
        return first, second, joined

    first, second, joined = asyncio.run(scenario())
    Path(out).write_text(
        json.dumps(
            {
                "before": [generation_json(g) for g in first],
                "after": [generation_json(g) for g in second],
                "joined": joined,
            }
        )
    )
    engine.close()


if __name__ == "__main__":
    main(*sys.argv[1:6])
