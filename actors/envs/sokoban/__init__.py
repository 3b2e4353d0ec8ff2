"""Text Sokoban over reverse-play generated rooms; importing the package registers "sokoban"."""

from actors.envs.sokoban.env import SokobanEnv

__all__ = ["SokobanEnv"]
