"""The `llm` extractor: Prompt B / C through a chat model, answers validated by `parse`.

Two ways to reach a model behind one `generate(prompt, item_type) -> text` callable: a local transformers
model (the CPU default), or any OpenAI-compatible chat endpoint (a vLLM server on a GPU node,
the way to use vLLM from here: the library never links the actors' engine). Generation is
greedy: extraction should be reproducible, and sampling a 135M model's JSON only adds noise.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections import Counter
from collections.abc import Callable

from pydantic import BaseModel

from library.episodes import Episode
from library.experience import Candidate
from library.extraction import parse, prompts
from monitoring.metrics import metric

_LEADING_INTEGER = re.compile(r"\s*(-?\d+)")


class TransformersChat:
    """Chat completion with a local causal LM (e.g. from slea.models.load_model).

    With `guided` (the default), the JSON skeleton of the answer is written by us and the
    model writes only the values, one field at a time, each stopped at its closing delimiter:
    a 135M model asked for free-form JSON rambles instead of closing its brackets, yet writes
    usable field values. The answer still goes through the same strict parser, so a value of
    the wrong kind (a level that is not a level, a step that is not a number) is rejected.
    One lesson per call in guided mode."""

    def __init__(self, model, tokenizer, max_new_tokens: int = 256, guided: bool = True):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.guided = guided

    def __call__(self, prompt: str, item_type: type[BaseModel]) -> str:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        if not self.guided:
            return self._continue(text, self.max_new_tokens, stop=None)
        answer = "[{"
        fields = list(item_type.model_fields.items())
        per_field = max(8, self.max_new_tokens // len(fields))
        for position, (name, field) in enumerate(fields):
            is_number = field.annotation is int
            answer += ("" if position == 0 else ", ") + f'"{name}": ' + ("" if is_number else '"')
            value = self._continue(text + answer, 4 if is_number else per_field, stop="," if is_number else '"')
            if is_number:
                number = _LEADING_INTEGER.match(value)
                answer += number.group(1) if number else json.dumps(value.strip())  # a non-number fails validation
            else:
                answer += json.dumps(value.split('"')[0].strip())[1:-1] + '"'
        return answer + "}]"

    def _continue(self, text: str, max_new_tokens: int, stop: str | None) -> str:
        import torch

        inputs = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        options = {"stop_strings": [stop], "tokenizer": self.tokenizer} if stop else {}
        with torch.no_grad():
            output = self.model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                **options,
            )
        return self.tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


class EndpointChat:
    """Chat completion from an OpenAI-compatible server: POST <endpoint>/v1/chat/completions."""

    def __init__(self, endpoint: str, model: str = "default", max_new_tokens: int = 256, timeout_s: float = 120.0):
        base = endpoint.rstrip("/")
        self.url = base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.timeout_s = timeout_s

    def __call__(self, prompt: str, item_type: type[BaseModel]) -> str:
        # vLLM and other servers honour a JSON schema here; the parser still checks the answer.
        schema = {"type": "array", "maxItems": parse.MAX_ITEMS, "items": item_type.model_json_schema()}
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": self.max_new_tokens,
                "temperature": 0.0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "lessons", "schema": schema}},
            }
        ).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            reply = json.loads(response.read())
        return reply["choices"][0]["message"]["content"]


class LLMExtractor:
    """Prompt B for successes, Prompt C for failures; rejected answers are counted, never admitted."""

    name = "llm"

    def __init__(self, generate: Callable[[str, type[BaseModel]], str]):
        self.generate = generate
        self.calls: Counter[str] = Counter()  # prompt ("B" / "C") -> generations run
        self.rejected: Counter[str] = Counter()  # reason -> answers rejected
        self.last_answer = ""  # the most recent raw model answer (for logs and tests)

    def distil_success(self, episode: Episode, existing: list[str]) -> list[Candidate]:
        return self._run(
            "B",
            prompts.prompt_b(episode, existing),
            parse.StrategyItem,
            lambda text: parse.parse_strategies(text, episode),
        )

    def distil_failure(self, episode: Episode, reference: Episode | None) -> list[Candidate]:
        return self._run(
            "C",
            prompts.prompt_c(episode, reference),
            parse.WarningItem,
            lambda text: parse.parse_warnings(text, episode),
        )

    def _run(
        self, prompt_name: str, prompt: str, item_type: type[BaseModel], parse_answer: Callable[[str], list[Candidate]]
    ) -> list[Candidate]:
        self.calls[prompt_name] += 1
        self.last_answer = self.generate(prompt, item_type)
        try:
            return parse_answer(self.last_answer)
        except parse.ExtractionRejected as exc:
            self.rejected[exc.reason] += 1
            metric("library_extraction_failures_total").labels(backend=self.name, reason=exc.reason).inc()
            return []


def build_extractor(cfg, model_name: str):
    """The extractor a LibraryConfig asks for (`model_name`: the run's policy model, used when
    library.extractor_model is null)."""
    from library.extraction.rules import RulesExtractor

    if cfg.extractor == "rules":
        return RulesExtractor()
    if cfg.extractor_endpoint:
        return LLMExtractor(
            EndpointChat(cfg.extractor_endpoint, cfg.extractor_endpoint_model, cfg.extractor_max_new_tokens)
        )
    from slea.models import load_model

    model, tokenizer = load_model(cfg.extractor_model or model_name)
    return LLMExtractor(TransformersChat(model, tokenizer, cfg.extractor_max_new_tokens))
