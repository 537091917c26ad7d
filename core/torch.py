"""``anychip.torch``: the PyTorch front end's public name (it lives in anychip.frontends.torch)."""

from .frontends.torch import *  # noqa: F401,F403
from .frontends.torch import __all__  # noqa: F401
