"""The driver: the `slea` command line and what it runs (train, eval, bench, compare, doctor).

It sits above the three components (`actors`, `learner`, `library`) and imports them; nothing
imports it. The rest of `slea/` is the contracts every component imports (config, StepRecord,
the Redis transport, channel names), which import no component (`.importlinter` holds both rules).
"""
