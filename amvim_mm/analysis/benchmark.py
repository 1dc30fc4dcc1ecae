"""Moved to :mod:`amvim_mm.bench.measure`; this module keeps the old import path working."""
from amvim_mm.bench.measure import *  # noqa: F401,F403
from amvim_mm.bench.measure import _timer  # noqa: F401
