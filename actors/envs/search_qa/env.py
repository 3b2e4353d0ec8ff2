"""Search-augmented QA: the agent searches a passage corpus (top 3 by BM25) and answers once;
reward 1 for an exact match after SQuAD normalisation, F1 reported alongside."""

from __future__ import annotations

import hashlib
from typing import Any

from actors.envs.base import EnvObservation, EnvTask, ResetOutcome, StepOutcome, TextEnv
from actors.envs.bracket_actions import split_bracket_action
from actors.envs.registry import register_env
from actors.envs.search_qa.answer_metrics import exact_match, token_f1
from actors.envs.search_qa.knowledge_base import DEFAULT_KB_SEED
from actors.envs.search_qa.passage_search import PassageSearch, load_passage_search
from actors.envs.search_qa.questions import TASK_TYPES, Question, build_question

ACTION_TEMPLATES = ["search[<query>]", "answer[<answer>]"]  # free-text slots in angle brackets
NOTHING_HAPPENS = "Nothing happens."


def search_of(params: dict[str, Any]) -> PassageSearch:
    return load_passage_search(int(params.get("kb_seed", DEFAULT_KB_SEED)))


@register_env("search_qa")
class SearchQAEnv(TextEnv):
    """Params: kb_seed (default 1729), the knowledge base the questions are about."""

    default_max_steps = 10

    def __init__(self, params: dict[str, Any] | None = None, max_steps: int | None = None):
        super().__init__(params, max_steps)
        self.retriever = search_of(self.params)
        self.question: Question | None = None
        self.state_text = ""  # the last search results (or the question before any search)
        self.searched: list[str] = []  # queries searched so far, in order
        self.steps_taken = 0
        self.done = False

    def task_types(self) -> list[str]:
        return list(TASK_TYPES)

    def make_task(self, seed: int, split: str) -> EnvTask:
        question = build_question(self.retriever.kb, seed)
        return EnvTask(
            env_name=self.name,
            task_id=f"{self.name}/{split}/{seed}",
            task_type=question.task_type,
            seed=seed,
            params=dict(self.params),
        )

    def fingerprint(self, task: EnvTask) -> str:
        # Different seeds can pick the same template and entities: the question is the task.
        question = build_question(search_of(task.params).kb, task.seed)
        return f"{question.task_type}:{hashlib.sha256(question.text.encode()).hexdigest()[:16]}"

    def reset(self, task: EnvTask) -> ResetOutcome:
        self.retriever = search_of(task.params)
        self.question = build_question(self.retriever.kb, task.seed)
        self.state_text = f"Question: {self.question.text}"
        self.searched = []
        self.steps_taken = 0
        self.done = False
        return ResetOutcome(
            observation=self._observe(), task_text=self.question.text, task_type=self.question.task_type
        )

    def step(self, action: str | None) -> StepOutcome:
        if self.question is None:
            raise RuntimeError("SearchQAEnv.step() before reset(): reset the env with a task first")
        if self.done:
            return StepOutcome(
                self._observe(NOTHING_HAPPENS), 0.0, True, False, False, {"error": "episode is over; reset the env"}
            )
        self.steps_taken += 1
        parsed = split_bracket_action(action)
        verb, argument = parsed if parsed else ("", "")
        if verb == "answer":
            self.done = True
            correct = exact_match(argument, self.question.answer)
            info = {"em": correct, "f1": token_f1(argument, self.question.answer), "gold_answer": self.question.answer}
            observation = EnvObservation(
                text=f"Your answer: {argument}", anchor_obs=self.state_text, admissible_actions=[]
            )
            return StepOutcome(observation, 1.0 if correct else 0.0, True, correct, True, info)
        if verb == "search":
            self.searched.append(argument)
            self.state_text = self._results_text(argument)
        self.done = self.steps_taken >= self.max_steps
        valid = verb == "search"
        info = {"em": False, "f1": 0.0} if self.done else {}
        return StepOutcome(self._observe("" if valid else NOTHING_HAPPENS), 0.0, self.done, False, valid, info)

    def expert_action(self) -> str | None:
        """Search each entity on the chain (the next one is named in what the last search returned), then answer."""
        if self.question is None or self.done:
            return None
        for hop in self.question.hops:
            if hop not in self.searched:
                return f"search[{hop}]"
        return f"answer[{self.question.answer}]"

    def _results_text(self, query: str) -> str:
        passages = self.retriever.search(query)
        if not passages:
            return f'No passage matches "{query}".'
        lines = [f"Doc {rank} (Title: {p.title}) {p.text}" for rank, p in enumerate(passages, start=1)]
        return f'Search results for "{query}":\n' + "\n".join(lines)

    def _observe(self, prefix: str = "") -> EnvObservation:
        text = f"{prefix}\n{self.state_text}" if prefix else self.state_text
        return EnvObservation(
            text=text, anchor_obs=self.state_text, admissible_actions=[] if self.done else list(ACTION_TEMPLATES)
        )
