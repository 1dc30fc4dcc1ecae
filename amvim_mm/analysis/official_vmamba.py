"""Moved to :mod:`amvim_mm.bench.official_vmamba`; this module keeps the old import path
working."""
from amvim_mm.bench.official_vmamba import *  # noqa: F401,F403
