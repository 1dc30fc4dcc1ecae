"""Moved to :mod:`amvim_mm.bench.cpu`; this module keeps the old import path working."""
from amvim_mm.bench.cpu import *  # noqa: F401,F403
