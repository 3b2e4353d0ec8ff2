"""What the `alfworld` package ships, in the shape the task generator needs.

ALFWorld's games are downloads, but the package itself carries everything that defines them:
the ALFRED PDDL domain and text grammar (`alfworld/data`), which receptacle types hold which
object types and which objects can be cleaned/heated/cooled/toggled/sliced
(`alfworld/gen/constants.py`), the goals and task sentences of every task type
(`alfworld/gen/goal_library.py`), and for each of the 120 AI2-THOR floor plans the object types
present and the receptacle instances with the pose an agent takes to use them
(`alfworld/gen/layouts`). This module reads those files once and exposes them as plain data.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import alfworld
import alfworld.gen.constants as alfred_constants
import alfworld.gen.goal_library as goal_library
from alfworld.agents.environment.alfred_tw_env import TASK_TYPES as ALFWORLD_TASK_TYPES

TASK_TYPES: tuple[str, ...] = tuple(ALFWORLD_TASK_TYPES[index] for index in sorted(ALFWORLD_TASK_TYPES))

DOMAIN_PATH = Path(alfworld.__file__).parent / "data" / "alfred.pddl"
GRAMMAR_PATH = Path(alfworld.__file__).parent / "data" / "alfred.twl2"
LAYOUTS_DIR = Path(alfred_constants.__file__).parent / "layouts"

# Receptacles that can be carried (a mug, a pan) are objects in ALFWorld's text games, not places.
MOVABLE_RECEPTACLE_TYPES = frozenset(alfred_constants.MOVABLE_RECEPTACLES)
RECEPTACLE_TYPES = frozenset(alfred_constants.VAL_RECEPTACLE_OBJECTS) - MOVABLE_RECEPTACLE_TYPES
OPENABLE_TYPES = frozenset(alfred_constants.OPENABLE_CLASS_SET)
CAN_CONTAIN: dict[str, frozenset[str]] = {
    receptacle: frozenset(objects) for receptacle, objects in alfred_constants.VAL_RECEPTACLE_OBJECTS.items()
}
# An object type some receptacle can hold is one the agent can pick up; sliced pieces only exist
# after slicing, which none of the six task types needs.
PICKUPABLE_TYPES = frozenset(
    object_type
    for held in alfred_constants.VAL_RECEPTACLE_OBJECTS.values()
    for object_type in held
    if alfred_constants.OBJ_PARENTS.get(object_type, object_type) == object_type
)
CLEANABLE = frozenset(alfred_constants.VAL_ACTION_OBJECTS["Cleanable"])
HEATABLE = frozenset(alfred_constants.VAL_ACTION_OBJECTS["Heatable"])
COOLABLE = frozenset(alfred_constants.VAL_ACTION_OBJECTS["Coolable"])
SLICEABLE = frozenset(alfred_constants.VAL_ACTION_OBJECTS["Sliceable"])
# The lamp of look_at_obj_in_light must sit in a receptacle (the goal asks for the agent at the
# lamp's receptacle); the layouts never list a floor lamp's receptacle, so desk lamps are used,
# on the furniture AI2-THOR puts them on.
LAMP_TYPE = "DeskLamp"
LAMP_HOST_TYPES = frozenset({"Desk", "SideTable", "Dresser"})

# The appliance each state-change task needs, and the property its target object must have.
APPLIANCE = {
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
TARGET_PROPERTY = {
    "pick_clean_then_place_in_recep": CLEANABLE,
    "pick_heat_then_place_in_recep": HEATABLE,
    "pick_cool_then_place_in_recep": COOLABLE,
}


@dataclass(frozen=True)
class ReceptacleInstance:
    """One receptacle of a floor plan, e.g. the third cabinet of FloorPlan1."""

    alfred_id: str  # ALFRED object id, e.g. "Cabinet|+00.68|+00.50|-02.20" or "Sink|-01.90|+00.97|-01.50|SinkBasin"
    receptacle_type: str  # e.g. "Cabinet", "SinkBasin"
    location: str  # ALFRED location name of the pose used to reach it, e.g. "loc|0|-5|2|30"


@dataclass(frozen=True)
class FloorPlan:
    """An AI2-THOR room as the ALFRED layouts describe it."""

    name: str  # e.g. "FloorPlan301"
    room_type: str  # "Kitchen", "LivingRoom", "Bedroom" or "Bathroom"
    object_types: frozenset[str]  # pickupable object types present in the room
    receptacles: tuple[ReceptacleInstance, ...]  # every static receptacle instance, in a fixed order

    @property
    def receptacle_types(self) -> frozenset[str]:
        return frozenset(r.receptacle_type for r in self.receptacles)


def _room_type(floor_plan_number: int) -> str:
    for room_type, numbers in alfred_constants.SCENE_TYPE.items():
        if floor_plan_number in numbers:
            return room_type
    raise ValueError(f"floor plan {floor_plan_number} is in no ALFRED room type")


def _receptacle_type(alfred_id: str) -> str:
    # Sinks and bathtubs are used through their basin: "Sink|x|y|z|SinkBasin" is a SinkBasin.
    parts = alfred_id.split("|")
    return parts[-1] if parts[-1].endswith("Basin") else parts[0]


def _location_name(pose: list[float]) -> str:
    # The layouts store the pose in metres and degrees; ALFRED names locations by grid cell
    # (0.25 m), rotation quarter and camera horizon.
    x, z, rotation, horizon = pose
    step = alfred_constants.AGENT_STEP_SIZE
    return f"loc|{round(x / step)}|{round(z / step)}|{round(rotation / 90) % 4}|{round(horizon)}"


def _load_floor_plan(objects_file: Path) -> FloorPlan:
    name = objects_file.name.removesuffix("-objects.json")
    scene_types = set(json.loads(objects_file.read_text()))
    poses = json.loads((LAYOUTS_DIR / f"{name}-openable.json").read_text())
    receptacles = [
        ReceptacleInstance(alfred_id, _receptacle_type(alfred_id), _location_name(pose))
        for alfred_id, pose in sorted(poses.items())
        if _receptacle_type(alfred_id) in RECEPTACLE_TYPES
    ]
    # A few receptacle types (stove burners, coffee machines, garbage cans...) are in the room but
    # have no recorded pose: give each one instance at a location of its own.
    listed = {r.receptacle_type for r in receptacles}
    for receptacle_type in sorted((scene_types & RECEPTACLE_TYPES) - listed):
        owner = receptacle_type.removesuffix("Basin")
        alfred_id = f"{owner}|1|{receptacle_type}" if owner != receptacle_type else f"{receptacle_type}|1"
        receptacles.append(ReceptacleInstance(alfred_id, receptacle_type, f"loc|{receptacle_type}"))
    return FloorPlan(
        name=name,
        room_type=_room_type(int(name.removeprefix("FloorPlan"))),
        object_types=frozenset(scene_types & (PICKUPABLE_TYPES | {LAMP_TYPE})),
        receptacles=tuple(receptacles),
    )


@lru_cache(maxsize=1)
def floor_plans() -> tuple[FloorPlan, ...]:
    """All ALFRED floor plans, sorted by number so that every machine sees the same order."""
    files = sorted(LAYOUTS_DIR.glob("FloorPlan*-objects.json"), key=lambda f: int(re.findall(r"\d+", f.name)[0]))
    if not files:
        raise FileNotFoundError(f"no ALFRED layouts in {LAYOUTS_DIR}; is the alfworld package complete?")
    return tuple(_load_floor_plan(f) for f in files)


@lru_cache(maxsize=1)
def domain_text() -> str:
    return DOMAIN_PATH.read_text()


@lru_cache(maxsize=1)
def grammar_text() -> str:
    return GRAMMAR_PATH.read_text()


def goal_pddl(task_type: str, object_type: str, parent_type: str, toggle_type: str) -> str:
    """The goal library's PDDL goal; it also closes the problem's `(define`."""
    goal = goal_library.gdict[task_type]["pddl"]
    return goal.format(obj=object_type, recep=parent_type, toggle=toggle_type, mrecep="").replace("#", "-")


def task_templates(task_type: str) -> list[str]:
    return list(goal_library.gdict[task_type]["templates"])


def room_types_for(task_type: str) -> frozenset[str]:
    """ALFRED's rooms for a task type (no heating in a bedroom)."""
    return frozenset(alfred_constants.GOALS_VALID[task_type])
