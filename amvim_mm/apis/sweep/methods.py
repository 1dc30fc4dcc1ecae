"""The token-reduction methods the tools offer, and how one (method, ratio) becomes a reducer.

``tools/test.py --reduce`` and ``tools/prune_eval.py --methods`` offer the same names
(:data:`METHODS`) and put the same reducer on the built backbone (:func:`cell_reducer`), so
that ``test.py CONFIG CKPT --reduce M --ratio R`` measures what the sweep's (M, R) cell does:

* ``tome`` and ``random``: the AMVim protocol at the ratio (tokens removed at the start of the
  even blocks); ``random`` draws with a seed (a sweep's row is the mean over its seeds);
* ``evit`` and ``top``: prune after ``locations`` (default ToP-ViM's Tiny schedule scaled to the
  depth, :meth:`ReductionSchedule.importance_locations`) at the keep rate whose realised ratio
  is nearest to the requested one (:meth:`ReductionSchedule.keep_rate_for_ratio`);
* ``learned``: the learned reducer the model's own config carries (e.g. a ``*_dynamicvit.py``
  fine-tuning config), at the ratio it was fine-tuned for; every other method replaces it, so
  those run on the fine-tuned weights with the learned reducer off.

Ratio 0 means no reduction (for a learned config too: its reducer is off).
"""
from __future__ import annotations

from typing import Optional, Sequence

from amvim_mm.errors import ConfigError
from amvim_mm.models.reduction.reducers import TokenReducer
from amvim_mm.models.reduction.schedule import ReductionSchedule

#: method name of the tools -> reducer type (``learned``: the config's own learned reducer)
METHODS = {'tome': 'ToMe', 'random': 'RandomPrune', 'evit': 'EViT', 'top': 'ToP',
           'learned': 'learned'}
#: the learned reducer the model's config carries (fine-tuned with it): evaluated at its own
#: ratio, so a ratio does not apply
LEARNED = 'learned'
#: methods ranked by importance: keep-rate schedules after ``locations``
IMPORTANCE_METHODS = ('evit', 'top')
#: methods with a random choice: one evaluation per seed
SEEDED_METHODS = ('random', )
#: the version of a method's rule where it changed after rows were stored (default 1): a
#: stored row of an older version is recomputed, not reused. EViT 2: its fused token is read
#: (scanned first in every path; version 1 scanned it last, where nothing read it)
METHOD_VERSIONS = {'evit': 2}


def method_version(method: str) -> int:
    """The version of ``method``'s rule that rows computed now carry."""
    return METHOD_VERSIONS.get(method, 1)


def row_is_current(row: dict) -> bool:
    """Whether a stored row was computed with the method's current rule (rows without a
    ``method_version`` are version 1)."""
    return row.get('method_version', 1) == method_version(row['method'])


def check_method(method: str) -> None:
    """A :class:`ConfigError` naming the choices for a method the tools do not offer."""
    if method not in METHODS:
        raise ConfigError(f'unknown method {method!r}; choose from {", ".join(METHODS)}')


def check_ratio(ratio: float) -> None:
    """A :class:`ConfigError` for a ratio outside [0, 1), before any model is built."""
    if not 0 <= ratio < 1:
        raise ConfigError(f'ratio {ratio} is outside [0, 1)')


def check_reduction_args(method: Optional[str], ratio: Optional[float], seed: Optional[int],
                         locations: Optional[Sequence[int]]) -> None:
    """One-line errors for the combinations of the tools' ``--reduce`` options (``--ratio``,
    ``--seed``, ``--locations``) that do not apply (tools/test.py, tools/deploy)."""
    if method == LEARNED:
        if ratio is not None:
            raise ConfigError('--ratio does not apply to --reduce learned: the learned reducer '
                              'runs at the ratio it was fine-tuned for; drop --ratio')
    elif (method is None) != (ratio is None):
        raise ConfigError('--reduce and --ratio go together (only --reduce learned takes no '
                          '--ratio)')
    if ratio is not None:
        check_ratio(ratio)
    if seed is not None and method not in SEEDED_METHODS:
        raise ConfigError(f'--seed applies to --reduce {" / ".join(SEEDED_METHODS)} only')
    if locations is not None and method not in IMPORTANCE_METHODS:
        raise ConfigError(f'--locations applies to --reduce {" / ".join(IMPORTANCE_METHODS)} '
                          'only')


#: how far an importance method's realised ratio may lie from the asked one (its keep rate
#: prunes whole tokens at a few blocks, so not every ratio is reachable exactly)
RATIO_TOLERANCE = 0.05


def reduction_config(method: str, ratio: float, num_patches: int, depth: int,
                     locations: Optional[Sequence[int]] = None, seed: int = 0
                     ) -> Optional[dict]:
    """The reducer config of a training-free method at ``ratio`` for a backbone with
    ``num_patches`` tokens and ``depth`` blocks (None at ratio 0); see the module docstring."""
    if method == LEARNED:
        raise ConfigError('method learned has no reducer config: it is the learned reducer '
                          'of the model\'s own config (see cell_reducer)')
    check_method(method)
    if ratio == 0:
        return None
    if method in IMPORTANCE_METHODS:
        locs = list(locations or ReductionSchedule.importance_locations(depth))
        keep = ReductionSchedule.keep_rate_for_ratio(ratio, num_patches, depth, locs)
        realised = ReductionSchedule.realised_ratio(
            ReductionSchedule(keep_rate=keep, locations=tuple(locs)).removals(num_patches,
                                                                              depth),
            num_patches)
        if abs(realised - ratio) > RATIO_TOLERANCE:
            raise ConfigError(f'{method}: ratio {ratio:g} is out of reach when pruning after '
                              f'blocks {locs} of {depth} (the nearest reachable ratio is '
                              f'{realised:.3f}); give a smaller ratio or earlier --locations')
        return dict(type=METHODS[method], keep_rate=keep, locations=locs)
    cfg = dict(type=METHODS[method], ratio=ratio)
    if method in SEEDED_METHODS:
        cfg['seed'] = int(seed)
    return cfg


def cell_reducer(backbone, method: str, ratio: Optional[float],
                 locations: Optional[Sequence[int]] = None, seed: int = 0, learned=None):
    """What to pass to ``backbone.set_token_reduction`` for one (method, ratio) cell.

    ``learned`` is the learned reducer the model was built with (:func:`learned_reducer`,
    taken before any cell replaced it); method ``learned`` returns it (``ratio`` is ignored),
    every other method the config dict of :func:`reduction_config` for the backbone's token
    grid and depth (None at ratio 0).
    """
    if method == LEARNED:
        if learned is None:
            raise ConfigError(f'method learned needs a model with a learned reducer; '
                              f'{type(backbone).__name__} has none')
        return learned
    M, depth = backbone.reduction_domain()
    return reduction_config(method, ratio, M, depth, locations, seed)


def learned_reducer(backbone):
    """The backbone's current reducer if it is a learned one (the config's), else None."""
    reducer = getattr(backbone, 'token_reducer', None)
    return reducer if isinstance(reducer, TokenReducer) and reducer.learned else None


def config_has_learned_reducer(cfg) -> bool:
    """Whether the model config's backbone (also inside a ``ReducerFineTuner``) has a learned
    token reducer (checked on the config, before a model is built)."""
    from amvim_mm.models.reduction import TOKEN_REDUCERS
    model = cfg.get('model') or {}
    backbone = (model.get('model') or {}).get('backbone') or model.get('backbone') or {}
    red = backbone.get('token_reduction') if isinstance(backbone, dict) else None
    cls = TOKEN_REDUCERS.get(red.get('type')) if isinstance(red, dict) and \
        isinstance(red.get('type'), str) else None
    return cls is not None and cls.learned
