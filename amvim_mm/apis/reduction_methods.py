"""Moved to :mod:`amvim_mm.apis.sweep.methods`; this module keeps the old import path working."""
from amvim_mm.apis.sweep.methods import (IMPORTANCE_METHODS, LEARNED, METHODS,  # noqa: F401
                                         SEEDED_METHODS, cell_reducer, check_method,
                                         check_ratio, config_has_learned_reducer,
                                         learned_reducer, reduction_config)
