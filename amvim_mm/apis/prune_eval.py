"""Moved to the package :mod:`amvim_mm.apis.sweep` (store, cell, run, intervals, report,
methods); this module keeps the old import path working."""
from amvim_mm.apis.sweep import *  # noqa: F401,F403
from amvim_mm.apis.sweep import __all__  # noqa: F401
