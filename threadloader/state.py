"""Mid-epoch resume, as :mod:`threadloader.resume` (kept importable: tests and integrations import from here)."""

from .resume import *  # noqa: F401,F403
from .resume import __all__  # noqa: F401
