"""Every numeric setting of every registered reducer and of ReducerFineTuner is validated at
build: NaN, +-inf, a bool and an out-of-range value each stop it with a one-line ConfigError
that names the key. The settings come from the constructors' signatures, so a new reducer or
a new argument without an entry in the tables below fails here, by name."""
import inspect
import math

import numpy as np
import pytest
import torch

import amvim_mm  # noqa: F401
import mmpretrain.models  # noqa: F401  (registers ImageClassifier)

from amvim_mm.errors import ConfigError
from amvim_mm.models.reducer_finetuner import ReducerFineTuner
from amvim_mm.models.reduction import TOKEN_REDUCERS, build_reducer
from amvim_mm.models.reduction.keep_predictor import KeepPredictor, gumbel_keep
from amvim_mm.models.reduction.learned_losses import ltmp_loss
from amvim_mm.models.reduction.threshold_masker import ThresholdMasker
from amvim_mm.registry import MODELS

NAN, INF = math.nan, math.inf

#: a setting that is not a number, and why it is left to other tests
OTHER = 'not numeric'


def _schedule():
    """The schedule's settings, shared by the training-free reducers: per key, the other
    settings it needs, its out-of-range values and valid edge values."""
    return dict(
        ratio=(dict(), [1, 1.0, -0.1], [0, 0.0, 0.999, np.float32(0.2)]),
        r=(dict(), [-1, [1, -1, 0, 0]], [0, np.int64(1), [0, 1, 0, 0]]),
        keep_rate=(dict(locations=(1, )), [0, -0.5, 1.5], [1, 1.0, 1e-3]),
        locations=(dict(keep_rate=0.8), [-1, (-1, 1)], [0, (0, 2), np.int64(1)]),
    )


SETTINGS = {
    'ToMe': dict(_schedule(), metric=OTHER),
    'RandomPrune': dict(_schedule(), seed=(dict(ratio=0.2), [-1, 2 ** 64],
                                           [0, 2 ** 64 - 1, np.int64(7)])),
    'EViT': _schedule(),
    'ToP': dict(_schedule(), align=OTHER, gap_delta=OTHER),
    'DynamicViT': dict(
        keep_rate=(dict(), [0, -0.1, 1.5], [1, 1e-3]),
        locations=(dict(), [-1, (2, -1)], [0, (0, 2)]),
        tau=(dict(), [0, -1.0], [1e-6, 1e6]),
        ratio_weight=(dict(), [-1, -1e-9], [0, 0.0, 100]),
    ),
    'LTMP': dict(
        blocks=(dict(), [0, (1, 0), []], [1, (1, 2, 3), np.int64(2)]),
        merge_init=(dict(), [1, 1.0, 1.5, -1.001], [-1, -1.0, 0.0, 0.999]),
        prune_init=(dict(), [1, 1.0, -1e-3, 5.0], [0, 0.0, 0.999]),
        tau=(dict(), [0, -0.1], [1e-6, 1e6]),
        target=(dict(), [0, 1.5, -0.5], [1, 1.0, 1e-3]),
        reg_scale=(dict(), [-1, -1e-3], [0, 0.0, 1e6]),
        merge=OTHER, prune=OTHER,
    ),
}
#: what every numeric setting refuses, besides its out-of-range values
BAD_KINDS = {'nan': NAN, 'inf': INF, '-inf': -INF, 'bool': True}


def _init_params(cls):
    """The keyword settings a class accepts: its ``__init__``'s named arguments, followed
    through ``*args`` / ``**kwargs`` to the base classes they are forwarded to."""
    names = []
    for klass in cls.__mro__:
        if '__init__' not in vars(klass):
            continue
        params = inspect.signature(vars(klass)['__init__']).parameters.values()
        names += [p.name for p in params if p.name != 'self' and p.kind in (
            p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names]
        if not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            break
    return names


REDUCER_KEYS = [(typ, key) for typ in sorted(TOKEN_REDUCERS.module_dict)
                for key in _init_params(TOKEN_REDUCERS.get(typ))]


def _spec(typ, key):
    if typ not in SETTINGS:
        pytest.fail(f'reducer {typ!r} has no entry in SETTINGS: add its settings and ranges')
    if key not in SETTINGS[typ]:
        pytest.fail(f'{typ}.{key} has no entry in SETTINGS[{typ!r}]: add its range')
    return SETTINGS[typ][key]


def _assert_names(err, owner, key, value):
    msg = str(err.value)
    assert '\n' not in msg, msg
    assert owner in msg and f' {key} ' in msg and repr(value) in msg, msg


def test_tables_match_the_signatures():
    """No stale entry: every key of the tables is a real setting (the other direction is
    checked per setting below)."""
    assert set(SETTINGS) == set(TOKEN_REDUCERS.module_dict)
    for typ, table in SETTINGS.items():
        assert set(table) == set(_init_params(TOKEN_REDUCERS.get(typ))), typ
    assert set(FINETUNER) == set(_init_params(ReducerFineTuner))


@pytest.mark.parametrize('typ,key', REDUCER_KEYS, ids=[f'{t}.{k}' for t, k in REDUCER_KEYS])
def test_every_reducer_setting_is_checked(typ, key):
    spec = _spec(typ, key)
    if spec is OTHER:
        return
    base, out_of_range, edges = spec
    bad = list(BAD_KINDS.values()) + list(out_of_range)
    if key in ('r', 'locations', 'blocks'):    # lists of ints: a bad entry too
        bad += [[1, NAN], [1, True]]
    for value in bad:
        with pytest.raises(ConfigError) as err:
            build_reducer(dict(base, type=typ, **{key: value}))
        _assert_names(err, typ, key, value)
    for value in edges:                          # valid edge values still build
        red = build_reducer(dict(base, type=typ, **{key: value}))
        assert red is not None


# --------------------------------------------------------------------------- the fine-tuner
CLASSIFIER = dict(
    type='mmpretrain.ImageClassifier',
    data_preprocessor=dict(type='mmpretrain.ClsDataPreprocessor', num_classes=3),
    backbone=dict(type='Vim', arch='test', img_size=32, patch_size=4, stride=4,
                  out_type='cls_token', fused_mixer=False,
                  token_reduction=dict(type='DynamicViT', keep_rate=0.7, locations=(0, 2))),
    neck=None,
    head=dict(type='mmpretrain.LinearClsHead', num_classes=3, in_channels=32,
              loss=dict(type='mmpretrain.CrossEntropyLoss')))

FINETUNER = dict(
    model=OTHER, train_only_reducer=OTHER, data_preprocessor=OTHER, init_cfg=OTHER,
    logit_weight=([-1, -1e-9], [0, 0.0, 2]),
    token_weight=([-1, -1e-9], [0, 0.0, 2]),
)
FINETUNER_KEYS = _init_params(ReducerFineTuner)


@pytest.mark.parametrize('key', FINETUNER_KEYS)
def test_every_finetuner_setting_is_checked(key):
    if key not in FINETUNER:
        pytest.fail(f'ReducerFineTuner.{key} has no entry in FINETUNER: add its range')
    if FINETUNER[key] is OTHER:
        return
    out_of_range, edges = FINETUNER[key]
    for value in list(BAD_KINDS.values()) + out_of_range:
        with pytest.raises(ConfigError) as err:
            MODELS.build(dict(type='ReducerFineTuner', model=CLASSIFIER, **{key: value}))
        _assert_names(err, 'ReducerFineTuner', key, value)
    for value in edges:
        cfg = dict(type='ReducerFineTuner', model=CLASSIFIER, train_only_reducer=True,
                   logit_weight=0, token_weight=0)
        w = MODELS.build(dict(cfg, **{key: value}))
        assert getattr(w, key) == value and type(getattr(w, key)) is float
        assert (w.teacher is None) == (w.logit_weight == 0 and w.token_weight == 0)


# ------------------------------------------------------------------------- the issue's cases
@pytest.mark.parametrize('cfg,message', [
    (dict(type='LTMP', merge_init=NAN), 'LTMP: merge_init must be a number in [-1, 1), got nan'),
    (dict(type='LTMP', prune_init=NAN), 'LTMP: prune_init must be a number in [0, 1), got nan'),
    (dict(type='LTMP', merge_init=1.5), 'LTMP: merge_init must be a number in [-1, 1), got 1.5'),
    (dict(type='LTMP', prune_init=-0.5),
     'LTMP: prune_init must be a number in [0, 1), got -0.5'),
    (dict(type='LTMP', tau=INF), 'LTMP: tau must be a number in (0, inf), got inf'),
    (dict(type='LTMP', reg_scale=NAN), 'LTMP: reg_scale must be a number in [0, inf), got nan'),
    (dict(type='LTMP', reg_scale=-1.0),
     'LTMP: reg_scale must be a number in [0, inf), got -1.0'),
    (dict(type='DynamicViT', ratio_weight=NAN),
     'DynamicViT: ratio_weight must be a number in [0, inf), got nan'),
    (dict(type='DynamicViT', tau=INF), 'DynamicViT: tau must be a number in (0, inf), got inf'),
    (dict(type='RandomPrune', ratio=0.2, seed=2.5),
     'RandomPrune: seed must be an int in [0, 18446744073709551615], got 2.5'),
    (dict(type='ToMe', ratio=NAN), 'ToMe: ratio must be a number in [0, 1), got nan'),
    (dict(type='ToP', keep_rate=INF, locations=(1, )),
     'ToP: keep_rate must be a number in (0, 1], got inf'),
])
def test_issue_cases_fail_at_build_with_one_line(cfg, message):
    with pytest.raises(ConfigError) as err:
        build_reducer(cfg)
    assert str(err.value) == message
    # through a backbone's config as well: the same line, not wrapped
    with pytest.raises(ConfigError) as err:
        MODELS.build(dict(type='Vim', arch='test', img_size=32, patch_size=4, stride=4,
                          token_reduction=cfg))
    assert str(err.value).endswith(message) and '\n' not in str(err.value)


def test_finetuner_nan_logit_weight_fails_at_build():
    with pytest.raises(ConfigError) as err:
        MODELS.build(dict(type='ReducerFineTuner', model=CLASSIFIER, logit_weight=NAN))
    assert str(err.value).endswith(
        'ReducerFineTuner: logit_weight must be a number in [0, inf), got nan')


def test_valid_values_round_trip_as_floats():
    red = build_reducer(dict(type='LTMP', merge_init=np.float32(0.5), prune_init=0, tau=1,
                             target=1, reg_scale=0, blocks=[3, 1, 3]))
    cfg = red.config()
    assert cfg['blocks'] == [1, 3]
    assert all(type(cfg[k]) is float for k in ('merge_init', 'prune_init', 'tau', 'target',
                                                 'reg_scale'))
    assert build_reducer(cfg).config() == cfg
    dvit = build_reducer(dict(type='DynamicViT', tau=2, ratio_weight=0))
    assert (dvit.tau, dvit.ratio_weight) == (2.0, 0.0)
    assert build_reducer(dvit.config()).config() == dvit.config()
    rp = build_reducer(dict(type='RandomPrune', ratio=0.2, seed=2 ** 64 - 1))
    from amvim_mm.models.reduction.reducers import mask_seed
    torch.Generator().manual_seed(mask_seed(rp.seed, 'a.png', 0))   # the largest seed hashes
    assert rp.seed == 2 ** 64 - 1 and type(rp.seed) is int


def test_learned_reducer_parts_check_their_settings():
    for value, msg in ((INF, 'got inf'), (0, 'got 0'), (True, 'got True')):
        with pytest.raises(ConfigError, match=f'ThresholdMasker: tau must be .*{msg}'):
            ThresholdMasker(tau=value)
    with pytest.raises(ConfigError, match='ThresholdMasker: init must be .*got nan'):
        ThresholdMasker(init=NAN)
    for value in (16.0, True, NAN):
        with pytest.raises(ConfigError, match='KeepPredictor: embed_dims must be an even int'):
            KeepPredictor(value)
    with pytest.raises(ConfigError, match=r'gumbel_keep: tau must be a number in \(0, inf\)'):
        gumbel_keep(torch.zeros(1, 2, 2), torch.ones(1, 2, 1), tau=INF)
    ce, r = torch.tensor(1.0), torch.tensor(0.5)
    for kw, key in ((dict(target=NAN), 'target'), (dict(reg_scale=-1), 'reg_scale'),
                    (dict(cls_scale=INF), 'cls_scale')):
        with pytest.raises(ConfigError, match=f'ltmp_loss: {key} must be'):
            ltmp_loss(ce, r, **kw)
    assert ltmp_loss(ce, r, target=1, reg_scale=0).item() == 1.0
