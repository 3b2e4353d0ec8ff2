"""Prompt A + the verl-agent observation, through the real SmolLM2 chat template."""

from actors.prompts import EXPERIENCE_HEADER, Experience, PromptBuilder, TurnHistory
from slea.models import shipped_tokenizer

TOKENIZER = shipped_tokenizer()
EXPERIENCES = [
    Experience("s1", "strategy", "Clean the mug at the sinkbasin before you put it in the coffeemachine."),
    Experience("s2", "strategy", "Look for mugs on countertops first."),
    Experience("w1", "warning", "Putting a dirty mug in the coffeemachine fails the task."),
]


def history_with(steps: int) -> TurnHistory:
    history = TurnHistory("put a clean mug in coffeemachine.")
    for step in range(steps):
        history.record(f"observation number {step}", f"go to countertop {step}")
    return history


def test_prompt_has_experiences_history_and_instructions():
    builder = PromptBuilder(TOKENIZER, history_length=2)
    ids, used = builder.build(
        history_with(3), "You arrive at sinkbasin 1.", ["clean mug 1 with sinkbasin 1", "look"], EXPERIENCES
    )
    text = TOKENIZER.decode(ids)
    assert [e.experience_id for e in used] == ["s1", "s2", "w1"]
    assert (
        EXPERIENCE_HEADER in text and "- Look for mugs on countertops first." in text and "Mistakes to avoid:" in text
    )
    assert "already taken 3 step(s)" in text and "observation number 2" in text and "observation number 0" not in text
    assert "'clean mug 1 with sinkbasin 1'" in text and "<action> </action>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_experience_block_respects_its_token_budget():
    builder = PromptBuilder(TOKENIZER, max_experience_tokens=25)
    _ids, used = builder.build(history_with(0), "obs", [], EXPERIENCES)
    assert [e.experience_id for e in used] == ["s1"]
    _ids, none = PromptBuilder(TOKENIZER, max_experience_tokens=5).build(history_with(0), "obs", [], EXPERIENCES)
    assert none == []


def test_an_experience_over_the_budget_is_skipped_not_the_end_of_the_list():
    # Token cost of each "- text\n" line, counted by hand from the SmolLM2 pieces:
    # s1 "-| Clean| the| m|ug| at| the| sink|bas|in| before| you| put| it| in| the| coff|eem|achine|.|\n" = 21,
    # s2 "-| Look| for| m|ugs| on| counter|tops| first|.|\n" = 11,
    # w1 "-| Putting| a| dirty| m|ug| in| the| coff|eem|achine| fails| the| task|.|\n" = 16.
    costs = [len(TOKENIZER.encode(f"- {e.text}\n", add_special_tokens=False)) for e in EXPERIENCES]
    assert costs == [21, 11, 16]
    strategy, short_strategy, warning = EXPERIENCES
    # Budget 20: the long strategy (21) does not fit, the warning ranked after it (16) does.
    ids, used = PromptBuilder(TOKENIZER, max_experience_tokens=20).build(
        history_with(0), "obs", [], [strategy, warning]
    )
    text = TOKENIZER.decode(ids)
    assert [e.experience_id for e in used] == ["w1"]
    assert f"Mistakes to avoid:\n- {warning.text}" in text and "Strategies that worked:" not in text
    # Rank order kept, budget inclusive: s2 11, s1 would make 32 > 27 (skipped), w1 makes 11 + 16 = 27.
    ranked = [short_strategy, strategy, warning]
    assert [e.experience_id for e in PromptBuilder(TOKENIZER, max_experience_tokens=27).fit_experiences(ranked)] == [
        "s2",
        "w1",
    ]
    assert [e.experience_id for e in PromptBuilder(TOKENIZER, max_experience_tokens=26).fit_experiences(ranked)] == [
        "s2"
    ]


def test_history_shrinks_then_prompt_is_clipped_to_the_budget():
    long_history = history_with(2)
    long_history.observations[-1] = "word " * 300
    builder = PromptBuilder(TOKENIZER, history_length=2, max_prompt_tokens=250)
    ids, _ = builder.build(long_history, "You arrive at sinkbasin 1.", [], [])
    assert len(ids) <= 250 and "word word" not in TOKENIZER.decode(ids)
    ids, _ = PromptBuilder(TOKENIZER, max_prompt_tokens=64).build(history_with(0), "x " * 400, [], [])
    assert len(ids) == 64 and TOKENIZER.decode(ids).endswith("<|im_start|>assistant\n")


def test_the_task_is_stated_once_whatever_the_env_prefixes_it_with():
    builder = PromptBuilder(TOKENIZER, history_length=0)
    for task in ("Your task is to: put a clean mug in coffeemachine.", "put a clean mug in coffeemachine."):
        ids, _ = builder.build(TurnHistory(task), "obs", [], [])
        text = TOKENIZER.decode(ids)
        assert text.count("Your task is to:") == 1 and "Your task is to: put a clean mug" in text


def test_compact_prompt_lists_actions_and_opens_the_reply_with_the_action_tag():
    builder = PromptBuilder(TOKENIZER, history_length=1, style="compact")
    ids, used = builder.build(
        history_with(2), "You arrive at sinkbasin 1.", ["clean mug 1 with sinkbasin 1", "look"], EXPERIENCES[:1]
    )
    text = TOKENIZER.decode(ids)
    assert [e.experience_id for e in used] == ["s1"] and "Strategies that worked:" in text
    assert "Task: put a clean mug in coffeemachine." in text
    assert "Step 2: observation number 1\nYou did: go to countertop 1\n" in text and "observation number 0" not in text
    assert "Admissible actions:\nclean mug 1 with sinkbasin 1\nlook\n" in text
    assert "<think>" not in text and builder.response_prefix == "<action>"
    assert text.endswith("<|im_start|>assistant\n<action>")  # the model only writes the action and its closing tag


def _shared_prefix(first: list[int], second: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))


def test_the_prefix_stable_layout_keeps_what_consecutive_steps_share_at_the_front():
    """Step 2 and step 3 of an episode retrieve different experiences. With the experiences in the
    system message the two prompts part at the first lesson; with the
    prefix-stable layout they share the system message, the instructions and the task, and part at
    the history, and the experiences sit after the history, just before the observation."""
    history_length, observation, admissible = 2, "You arrive at sinkbasin 1.", ["look"]
    for style in ("reasoning", "compact"):
        prompts = {}
        for layout in ("experiences_first", "prefix_stable"):
            builder = PromptBuilder(TOKENIZER, history_length=history_length, style=style, layout=layout)
            step_2, _ = builder.build(history_with(1), observation, admissible, EXPERIENCES[:1])
            step_3, _ = builder.build(history_with(2), observation, admissible, EXPERIENCES[1:])
            prompts[layout] = (step_2, step_3)
        first = _shared_prefix(*prompts["experiences_first"])
        stable = _shared_prefix(*prompts["prefix_stable"])
        parted_at = TOKENIZER.decode(prompts["experiences_first"][0][:first])
        assert parted_at.endswith("Strategies that worked:\n-"), (style, parted_at)  # inside the system message
        shared = TOKENIZER.decode(prompts["prefix_stable"][0][:stable])
        assert "You are a helpful AI assistant named SmolLM" in shared and "put a clean mug in coffeemachine" in shared
        text = TOKENIZER.decode(prompts["prefix_stable"][1])
        history_at, experiences_at = text.index("observation number 1"), text.index(EXPERIENCE_HEADER)
        assert history_at < experiences_at < text.index(observation)
        assert stable > first, (style, stable, first)


def test_without_experiences_the_two_layouts_are_the_same_prompt():
    for style in ("reasoning", "compact"):
        built = [
            PromptBuilder(TOKENIZER, style=style, layout=layout).build(history_with(2), "obs", ["look"], [])[0]
            for layout in ("experiences_first", "prefix_stable")
        ]
        assert built[0] == built[1]
