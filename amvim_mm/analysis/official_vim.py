"""Moved to :mod:`amvim_mm.bench.official_vim`; this module keeps the old import path working."""
from amvim_mm.bench.official_vim import *  # noqa: F401,F403
