"""Per-step prompts: retrieved experiences (Prompt A) + the observation, in one of two styles
and one of two layouts.

- `reasoning` is verl-agent's prompt: think inside <think>, then answer inside <action>. Models
  of about 1B parameters and up follow it.
- `compact` is for small models: one worked example of the answer format, the admissible
  actions one per line, no reasoning, and the reply opened with `<action>` (the response
  prefix, part of the prompt ids). SmolLM2-135M-Instruct gives an admissible action in 0 of 16
  first steps with `reasoning` and in 11 of 16 with `compact` (alfworld panel, temperature 0.7).

Layouts (where the experiences go; `actors.prompt_layout`):
- `experiences_first`: in the system message, before everything else (every study so far ran it).
  The experiences change from step to step, so two prompts part at the first lesson that differs,
  and an engine's prefix cache (vLLM's) holds little more of a step's prompt than the lessons' header.
- `prefix_stable`: the model's own system message, then the instructions, the task and the history,
  and the experiences just before the current observation, which they are about: consecutive
  prompts of an episode, and the prompts of a group's episodes, share everything up to the
  history, which vLLM's prefix cache can hold (`actor_cached_prompt_tokens_total`). It caches whole
  blocks only: on CPU (128-token blocks, longer than that shared front) configs/local.yaml measured
  49% of prompt tokens cached with experiences_first and 51% with prefix_stable.

Token in, token out: the prompt is tokenised here once with the model's chat template, and
exactly those ids are generated from and recorded in the StepRecord; nothing downstream ever
re-tokenises text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from transformers import PreTrainedTokenizerBase

PromptStyle = Literal["reasoning", "compact"]
PromptLayout = Literal["experiences_first", "prefix_stable"]

EXPERIENCE_HEADER = (
    "You can draw on experiences from earlier episodes in states like the current one. "
    "Use them only if they fit the current observation; ignore them otherwise."
)

OBSERVATION_TEMPLATE = """Your task is to: {task}
Prior to this step, you have already taken {steps_taken} step(s). {history}
{experiences}You are now at step {current_step} and your current observation is: {observation}
{admissible}
Now it's your turn to take an action.
You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags.
Once you've finished your reasoning, you should choose an action for the current step and present it within <action> </action> tags."""

COMPACT_TEMPLATE = """Example of the answer format.
Observation: You see a drawer 1 and a shelf 1.
Admissible actions:
go to drawer 1
go to shelf 1
look
Reply: <action>go to shelf 1</action>

Now you.
Task: {task}
{history}{experiences}Observation: {observation}
{admissible}Reply with one admissible action inside <action> </action> tags."""

COMPACT_RESPONSE_PREFIX = "<action>"  # the compact style opens the reply; the model writes the action
TASK_PREFIX = "Your task is to:"  # some envs (ALFWorld) start their instruction with it; the templates add their own


@dataclass
class Experience:
    """One retrieved library item as the prompt shows it."""

    experience_id: str  # library id, recorded in StepRecord.experience_ids
    zone: str  # "strategy" (E+) or "warning" (E-)
    text: str  # the lesson itself


@dataclass
class TurnHistory:
    """What an episode has seen so far (the prompt shows the last `history_length` pairs)."""

    task_text: str  # the instruction of the task
    observations: list[str] = field(default_factory=list)  # observation before each action taken
    actions: list[str] = field(default_factory=list)  # action text taken at each step ("" if unparsable)

    def record(self, observation: str, action: str) -> None:
        self.observations.append(observation)
        self.actions.append(action)


def experience_block(experiences: list[Experience]) -> str:
    """Prompt A: strategies then warnings, each one line, under a line saying when to use them."""
    if not experiences:
        return ""
    strategies = [e for e in experiences if e.zone == "strategy"]
    warnings = [e for e in experiences if e.zone == "warning"]
    lines = [EXPERIENCE_HEADER]
    if strategies:
        lines.append("Strategies that worked:")
        lines.extend(f"- {e.text}" for e in strategies)
    if warnings:
        lines.append("Mistakes to avoid:")
        lines.extend(f"- {e.text}" for e in warnings)
    return "\n".join(lines)


def _instruction(task_text: str) -> str:
    text = task_text.strip()
    return text[len(TASK_PREFIX) :].strip() if text.startswith(TASK_PREFIX) else text


def observation_text(
    history: TurnHistory,
    observation: str,
    admissible_actions: list[str],
    history_length: int,
    style: PromptStyle = "reasoning",
    experiences: str = "",
) -> str:
    """The user message; `experiences` (a block, or "") goes after the history, before the observation."""
    experiences = f"{experiences}\n" if experiences else ""
    if style == "compact":
        return compact_observation_text(history, observation, admissible_actions, history_length, experiences)
    steps_taken = len(history.actions)
    keep = min(history_length, steps_taken)
    if keep:
        pairs = [
            f"[Observation {steps_taken - keep + i + 1}: {obs!r}, Action {steps_taken - keep + i + 1}: {act!r}]"
            for i, (obs, act) in enumerate(zip(history.observations[-keep:], history.actions[-keep:]))
        ]
        history_text = f"Below are the most recent {keep} observations and the actions you took: " + " ".join(pairs)
    else:
        history_text = ""
    admissible = (
        f"Your admissible actions of the current situation are: [{', '.join(repr(a) for a in admissible_actions)}].\n"
        if admissible_actions
        else ""
    )
    return OBSERVATION_TEMPLATE.format(
        task=_instruction(history.task_text),
        steps_taken=steps_taken,
        history=history_text,
        current_step=steps_taken + 1,
        observation=observation,
        admissible=admissible,
        experiences=experiences,
    )


def compact_observation_text(
    history: TurnHistory, observation: str, admissible_actions: list[str], history_length: int, experiences: str = ""
) -> str:
    steps_taken = len(history.actions)
    keep = min(history_length, steps_taken)
    history_lines = (
        "".join(
            f"Step {steps_taken - keep + i + 1}: {obs}\nYou did: {act or '(no admissible action)'}\n"
            for i, (obs, act) in enumerate(zip(history.observations[-keep:], history.actions[-keep:]))
        )
        if keep
        else ""
    )
    admissible = (
        "Admissible actions:\n" + "".join(f"{action}\n" for action in admissible_actions) if admissible_actions else ""
    )
    return COMPACT_TEMPLATE.format(
        task=_instruction(history.task_text),
        history=history_lines,
        experiences=experiences,
        observation=observation,
        admissible=admissible,
    )


class PromptBuilder:
    """Builds the token ids of one step's prompt within a token budget."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        history_length: int = 2,
        max_prompt_tokens: int = 2048,
        max_experience_tokens: int = 200,
        style: PromptStyle = "reasoning",
        layout: PromptLayout = "experiences_first",
    ):
        self.tokenizer = tokenizer
        self.layout = layout
        self.history_length = history_length
        self.max_prompt_tokens = max_prompt_tokens
        self.max_experience_tokens = max_experience_tokens
        self.style = style
        # Text the prompt already opens the reply with: the generation continues it, so the action
        # parser reads `response_prefix + generated text`.
        self.response_prefix = COMPACT_RESPONSE_PREFIX if style == "compact" else ""
        self._prefix_ids = (
            tokenizer.encode(self.response_prefix, add_special_tokens=False) if self.response_prefix else []
        )

    @classmethod
    def from_config(cls, tokenizer: PreTrainedTokenizerBase, config) -> PromptBuilder:
        """The builder a run's actors (and its evaluations) use: `config` is a SleaConfig."""
        return cls(
            tokenizer,
            history_length=config.actors.history_length,
            max_prompt_tokens=config.model.max_prompt_tokens,
            max_experience_tokens=config.library.max_tokens,
            style=config.actors.prompt_style,
            layout=config.actors.prompt_layout,
        )

    def fit_experiences(self, experiences: list[Experience]) -> list[Experience]:
        """Keep, in rank order, every experience whose line still fits the experience token budget
        (the fixed header line is not counted: the budget is for lessons, as in the paper).

        One that does not fit is skipped, not the end of the list: the library ranks strategies
        before warnings, so stopping at a long strategy would silently drop the warning after it."""
        kept, used = [], 0
        for experience in experiences:
            cost = len(self.tokenizer.encode(f"- {experience.text}\n", add_special_tokens=False))
            if used + cost <= self.max_experience_tokens:
                kept.append(experience)
                used += cost
        return kept

    def build(
        self, history: TurnHistory, observation: str, admissible_actions: list[str], experiences: list[Experience]
    ) -> tuple[list[int], list[Experience]]:
        """(prompt token ids, the experiences actually in it). History shrinks first when over budget."""
        experiences = self.fit_experiences(experiences)
        block = experience_block(experiences)
        system, inline = (block, "") if self.layout == "experiences_first" else ("", block)
        for history_length in range(self.history_length, -1, -1):
            messages = [{"role": "system", "content": system}] if system else []
            user = observation_text(history, observation, admissible_actions, history_length, self.style, inline)
            messages.append({"role": "user", "content": user})
            ids = self._apply_template(messages) + self._prefix_ids
            if len(ids) <= self.max_prompt_tokens:
                return ids, experiences
        # Even without history the prompt is too long (huge admissible lists): keep its head and
        # tail so the template's instructions and the generation prompt survive.
        head = self.max_prompt_tokens // 4
        return ids[:head] + ids[len(ids) - (self.max_prompt_tokens - head) :], experiences

    def _apply_template(self, messages: list[dict]) -> list[int]:
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(encoded, "input_ids") or isinstance(encoded, dict):  # newer transformers return a BatchEncoding
            encoded = encoded["input_ids"]
        return list(encoded)
