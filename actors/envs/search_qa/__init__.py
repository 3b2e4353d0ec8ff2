"""Search-augmented QA over a generated encyclopedia; importing the package registers "search_qa"."""

from actors.envs.search_qa.env import SearchQAEnv

__all__ = ["SearchQAEnv"]
