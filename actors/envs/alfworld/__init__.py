"""ALFWorld household tasks (six task types) on ALFWorld's TextWorld/PDDL engine; see `env`."""

from actors.envs.alfworld.env import AlfworldEnv

__all__ = ["AlfworldEnv"]
