"""Seeded generation of ALFRED-format PDDL problems for ALFWorld's six task types.

A game is built the way ALFRED builds its tasks (`alfworld/gen/game_states/task_game_state.py`):
pick a floor plan whose room type suits the task, a target object type the room has and a
receptacle type that can hold it (never the appliance the task uses, as ALFRED's filters
require), then lay the room out: the floor plan's receptacle instances, the target objects in
compatible receptacles other than the goal one, distractor objects. The goal and the task
sentence come from ALFWorld's goal library. Everything is derived from (seed, task type,
difficulty) with a private RNG, so every machine builds byte-identical problems.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import cache, lru_cache

import alfworld.gen.constants as alfred_constants

from actors.envs.alfworld import catalog
from actors.envs.alfworld.catalog import FloorPlan, ReceptacleInstance

START_LOCATION = "loc|start"  # no receptacle there, so the first look is "You are in the middle of a room..."


@dataclass(frozen=True)
class Difficulty:
    """How large a generated room is: the knob that gives a small model a chance on ALFWorld."""

    max_receptacles: int | None  # receptacle instances kept from the floor plan (None: all, as in ALFWorld)
    distractors: int | None  # objects besides the task's own (None: one of each object type the room has)
    max_target_copies: int  # the target object appears 1..this many times (pick_two: at least 2)


# "easy" is sized so that a uniformly random admissible policy wins a few percent of 50-step
# episodes (a small model that reads the task does better); "full" keeps whole ALFRED rooms.
DIFFICULTIES: dict[str, Difficulty] = {
    "easy": Difficulty(max_receptacles=4, distractors=1, max_target_copies=2),
    "medium": Difficulty(max_receptacles=8, distractors=6, max_target_copies=2),
    "full": Difficulty(max_receptacles=None, distractors=None, max_target_copies=3),
}


@dataclass(frozen=True)
class TaskChoice:
    """The task a game poses, before the room is laid out."""

    floor_plan: FloorPlan  # the AI2-THOR room
    object_type: str  # what to move / examine, e.g. "Mug"
    parent_type: str  # receptacle type the object must end in ("" for look_at_obj_in_light)
    toggle_type: str  # lamp to switch on ("" unless look_at_obj_in_light)


@dataclass(frozen=True)
class GeneratedGame:
    """An ALFRED PDDL problem and its task sentence: with ALFWorld's domain and grammar, a whole game."""

    task_type: str  # one of catalog.TASK_TYPES
    floor_plan: str  # e.g. "FloorPlan12"
    object_type: str  # target object type, e.g. "Mug"
    parent_type: str  # goal receptacle type ("" for look_at_obj_in_light)
    toggle_type: str  # lamp type ("" unless look_at_obj_in_light)
    task_description: str  # e.g. "put a clean mug in coffeemachine" (ALFWorld's templated goal)
    pddl_problem: str  # the problem file, ALFRED format (ids escaped with _bar_, _dot_...)

    @property
    def game_data(self) -> dict:
        """The content of a `game.tw-pddl` file, what TextWorld's PddlEnv loads.

        The grammar is alfred.twl2 with the task sentence filled in, as ALFWorld's `add_task_to_grammar` does.
        """
        grammar = catalog.grammar_text().replace("UNKNOWN GOAL", self.task_description)
        return {"pddl_domain": catalog.domain_text(), "grammar": grammar, "pddl_problem": self.pddl_problem}

    @property
    def content_hash(self) -> str:
        return hashlib.sha256((self.pddl_problem + "\n" + self.task_description).encode()).hexdigest()


_PDDL_ESCAPES = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}


def pddl_name(alfred_id: str) -> str:
    """ALFRED's escaping of object ids (ALFWorld's Demangler turns them back into "cabinet 3")."""
    return "".join(_PDDL_ESCAPES.get(char, char) for char in alfred_id)


def _forbidden_start_type(task_type: str) -> str | None:
    # The target must not start where the task's state change happens (ALFRED's filters):
    # an object already in the fridge counts as cool.
    return catalog.APPLIANCE.get(task_type)


def _start_types(plan: FloorPlan, task_type: str, object_type: str, parent_type: str) -> list[str]:
    """Receptacle types of the room where a target object may start."""
    excluded = {parent_type, _forbidden_start_type(task_type)}
    return sorted(t for t in plan.receptacle_types - excluded if object_type in catalog.CAN_CONTAIN[t])


@cache
def task_choices(task_type: str) -> tuple[TaskChoice, ...]:
    """Every (room, target, receptacle) combination a task type can be posed with, in a fixed order."""
    choices = []
    for plan in catalog.floor_plans():
        if plan.room_type not in catalog.room_types_for(task_type):
            continue
        appliance = catalog.APPLIANCE.get(task_type)
        if appliance and appliance not in plan.receptacle_types:
            continue
        targets = sorted(plan.object_types & catalog.TARGET_PROPERTY.get(task_type, catalog.PICKUPABLE_TYPES))
        if task_type == "look_at_obj_in_light":
            if catalog.LAMP_TYPE not in plan.object_types or not plan.receptacle_types & catalog.LAMP_HOST_TYPES:
                continue
            choices += [
                TaskChoice(plan, target, "", catalog.LAMP_TYPE)
                for target in targets
                if _start_types(plan, task_type, target, "")
            ]
            continue
        for target in targets:
            for parent_type in sorted(plan.receptacle_types - {appliance}):
                if target in catalog.CAN_CONTAIN[parent_type] and _start_types(plan, task_type, target, parent_type):
                    choices.append(TaskChoice(plan, target, parent_type, ""))
    if not choices:
        raise ValueError(f"no ALFRED floor plan supports task type {task_type!r}")
    return tuple(choices)


def _task_rng(seed: int, task_type: str) -> random.Random:
    # A string seed hashed by us, not Python's hash(), so it is the same in every process.
    digest = hashlib.sha256(f"alfworld/{task_type}/{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "little"))


@lru_cache(maxsize=256)
def generate_game(seed: int, task_type: str, difficulty: Difficulty) -> GeneratedGame:
    """The game of this seed: the same bytes on every machine.

    Cached, because a task is generated twice in quick succession: for its fingerprint when it
    is sampled, and again when an env resets to it.
    """
    if task_type not in catalog.TASK_TYPES:
        raise ValueError(f"unknown ALFWorld task type {task_type!r}; known: {', '.join(catalog.TASK_TYPES)}")
    rng = _task_rng(seed, task_type)
    choices = task_choices(task_type)
    plans = sorted({c.floor_plan.name for c in choices}, key=lambda name: int(name.removeprefix("FloorPlan")))
    plan_name = rng.choice(plans)  # rooms first, so rooms with many objects do not dominate
    choice = rng.choice([c for c in choices if c.floor_plan.name == plan_name])
    template = rng.choice(catalog.task_templates(task_type))  # before the layout: same sentence at every difficulty
    layout = _lay_out_room(rng, task_type, choice, difficulty)
    description = template.format(
        obj=choice.object_type.lower(), recep=choice.parent_type.lower(), toggle=choice.toggle_type.lower(), mrecep=""
    )
    return GeneratedGame(
        task_type=task_type,
        floor_plan=plan_name,
        object_type=choice.object_type,
        parent_type=choice.parent_type,
        toggle_type=choice.toggle_type,
        task_description=description,
        pddl_problem=_problem_text(task_type, choice, layout, seed),
    )


@dataclass
class _Layout:
    receptacles: list[ReceptacleInstance]  # kept receptacle instances, in floor-plan order
    objects: list[tuple[str, str, ReceptacleInstance]]  # (alfred id, object type, receptacle it is in)


def _lay_out_room(rng: random.Random, task_type: str, choice: TaskChoice, difficulty: Difficulty) -> _Layout:
    plan = choice.floor_plan
    by_type: dict[str, list[ReceptacleInstance]] = {}
    for receptacle in plan.receptacles:
        by_type.setdefault(receptacle.receptacle_type, []).append(receptacle)

    # Receptacles the task cannot do without come first; the rest of the budget is random furniture.
    required: list[ReceptacleInstance] = []
    if choice.parent_type:
        required.append(rng.choice(by_type[choice.parent_type]))
    if task_type in catalog.APPLIANCE:
        required.append(rng.choice(by_type[catalog.APPLIANCE[task_type]]))
    lamp_hosts = [r for r in plan.receptacles if r.receptacle_type in catalog.LAMP_HOST_TYPES]
    lamp_host = rng.choice(lamp_hosts) if task_type == "look_at_obj_in_light" else None
    if lamp_host:
        required.append(lamp_host)
    start_types = _start_types(plan, task_type, choice.object_type, choice.parent_type)
    start_slots = [r for t in start_types for r in by_type[t]]
    low_copies = 2 if task_type == "pick_two_obj_and_place" else 1
    copies = rng.randint(low_copies, max(low_copies, difficulty.max_target_copies))
    target_homes = [rng.choice(start_slots) for _ in range(copies)]
    required += target_homes

    others = [r for r in plan.receptacles if r not in required]
    budget = len(plan.receptacles) if difficulty.max_receptacles is None else difficulty.max_receptacles
    extra = rng.sample(others, min(len(others), max(0, budget - len(set(required)))))
    kept_ids = {r.alfred_id for r in required} | {r.alfred_id for r in extra}
    kept = [r for r in plan.receptacles if r.alfred_id in kept_ids]

    placed: list[tuple[str, ReceptacleInstance]] = [(choice.object_type, home) for home in target_homes]
    if lamp_host is None and catalog.LAMP_TYPE in plan.object_types:
        hosts = [r for r in kept if r.receptacle_type in catalog.LAMP_HOST_TYPES]
        lamp_host = rng.choice(hosts) if hosts else None
    if lamp_host:
        placed.append((catalog.LAMP_TYPE, lamp_host))
    placed += _distractors(rng, plan, choice.object_type, kept, difficulty.distractors)

    counts: dict[str, int] = {}
    objects = []
    for object_type, home in placed:
        counts[object_type] = counts.get(object_type, 0) + 1
        objects.append((f"{object_type}|{counts[object_type]}", object_type, home))
    return _Layout(receptacles=kept, objects=objects)


def _distractors(
    rng: random.Random, plan: FloorPlan, target_type: str, kept: list[ReceptacleInstance], count: int | None
) -> list[tuple[str, ReceptacleInstance]]:
    """Other objects of the room, each in a kept receptacle that can hold it."""
    hosts = {
        object_type: [r for r in kept if object_type in catalog.CAN_CONTAIN[r.receptacle_type]]
        for object_type in sorted(plan.object_types & catalog.PICKUPABLE_TYPES - {target_type})
    }
    placeable = [object_type for object_type, receptacles in hosts.items() if receptacles]
    if not placeable:
        return []
    types = placeable if count is None else [rng.choice(placeable) for _ in range(count)]
    return [(object_type, rng.choice(hosts[object_type])) for object_type in types]


def _problem_text(task_type: str, choice: TaskChoice, layout: _Layout, seed: int) -> str:
    receptacle_types = sorted(catalog.RECEPTACLE_TYPES)
    object_types = sorted(set(alfred_constants.OBJECTS) - catalog.RECEPTACLE_TYPES)
    locations = sorted({r.location for r in layout.receptacles} | {START_LOCATION})
    used_object_types = sorted({object_type for _, object_type, _ in layout.objects})
    kept_receptacle_types = sorted({r.receptacle_type for r in layout.receptacles})

    declarations = ["agent1 - agent"]
    declarations += [f"{t}Type - otype" for t in object_types]
    declarations += [f"{t}Type - rtype" for t in receptacle_types]
    declarations += [f"{pddl_name(alfred_id)} - object" for alfred_id, _, _ in layout.objects]
    declarations += [f"{pddl_name(r.alfred_id)} - receptacle" for r in layout.receptacles]
    declarations += [f"{pddl_name(location)} - location" for location in locations]

    facts = [f"(atLocation agent1 {pddl_name(START_LOCATION)})"]
    for receptacle in layout.receptacles:
        name = pddl_name(receptacle.alfred_id)
        facts.append(f"(receptacleType {name} {receptacle.receptacle_type}Type)")
        facts.append(f"(receptacleAtLocation {name} {pddl_name(receptacle.location)})")
        if receptacle.receptacle_type in catalog.OPENABLE_TYPES:
            facts.append(f"(openable {name})")  # closed at the start, as in ALFWorld
    for receptacle_type in kept_receptacle_types:
        facts += [
            f"(canContain {receptacle_type}Type {t}Type)"
            for t in used_object_types
            if t in catalog.CAN_CONTAIN[receptacle_type]
        ]
    for alfred_id, object_type, home in layout.objects:
        name = pddl_name(alfred_id)
        facts.append(f"(objectType {name} {object_type}Type)")
        facts.append(f"(inReceptacle {name} {pddl_name(home.alfred_id)})")
        facts.append(f"(objectAtLocation {name} {pddl_name(home.location)})")
        properties = {
            "pickupable": object_type in catalog.PICKUPABLE_TYPES,
            "isReceptacleObject": object_type in catalog.MOVABLE_RECEPTACLE_TYPES,
            "cleanable": object_type in catalog.CLEANABLE,
            "heatable": object_type in catalog.HEATABLE,
            "coolable": object_type in catalog.COOLABLE,
            "sliceable": object_type in catalog.SLICEABLE,
            "toggleable": object_type == catalog.LAMP_TYPE,
        }
        facts += [f"({prop} {name})" for prop, holds in properties.items() if holds]

    goal = catalog.goal_pddl(task_type, choice.object_type, choice.parent_type, choice.toggle_type)
    indent = "\n        "
    return (
        f"(define (problem plan_{choice.floor_plan.name.lower()}_{seed})\n"
        f"    (:domain alfred)\n"
        f"    (:objects{indent}{indent.join(declarations)}\n    )\n"
        f"    (:init{indent}{indent.join(facts)}\n    )\n"
        f"{goal}"
    )
