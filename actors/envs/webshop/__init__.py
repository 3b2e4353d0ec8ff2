"""WebShop (Yao et al. 2022) rebuilt offline; importing the package registers the "webshop" env."""

from actors.envs.webshop.env import WebShopEnv

__all__ = ["WebShopEnv"]
