"""Moved to :mod:`amvim_mm.bench.dense`; this module keeps the old import path working."""
from amvim_mm.bench.dense import *  # noqa: F401,F403
