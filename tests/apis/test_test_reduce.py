"""``tools/test.py --reduce M`` measures what ``prune_eval``'s (M, R) cell measures, for every
method ``prune_eval --methods`` offers, on the three demo tasks (shipped demo checkpoints, a few
generated validation images of the demo's data).

Per task one in-process ``run_sweep`` evaluates every method at ratio 0.27 (segmentation also at
0); each method then goes through ``tools/test.py`` (one subprocess per task for the command
line, the others through its ``main`` in this process) and its printed metric must equal the
library's value of the row (``metric_library``; the row's ``metric`` is the same number recomputed
from the per-image statistics, unrounded). ``learned`` runs on the segmentation demo's DynamicViT config and checkpoint; on the other tasks (no learned
config) both tools refuse it with one line. The segmentation sweep's plain model carries a
``TokenReductionHook`` in its config, which neither tool may let override the asked reduction.
"""
import ast
import os.path as osp
import re
import sys

import pytest

from amvim_mm.apis.cli import run_cli
from amvim_mm.apis.sweep import METHODS, run_sweep
from amvim_mm.errors import ConfigError
from tests import test_tools_e2e as e2e

pytestmark = [pytest.mark.slow]

ROOT = e2e.ROOT
DEMO = osp.join(ROOT, 'configs/demo')
CKPTS = osp.join(ROOT, 'checkpoints/demo')
RATIO = 0.27
#: task -> (plain config, its checkpoint, data maker, number of validation images)
TASKS = {
    'seg': ('amvim-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py',
            'amvim-demo-seed0_toyshapes-64x64.pth', 'make_toy_shapes', 4),
    'det': ('vim-demo_sfp_retinanet_1xb8-2k_toyshapes-64x64.py',
            'vim-demo-det-seed0_toyshapes-64x64.pth', 'make_toy_shapes_coco', 4),
    'cls': ('amvim-demo_linear_1xb8-2k_toyshapes-64x64.py',
            'amvim-demo-cls-seed0_toyshapes-64x64.pth', 'make_toy_shapes_cls', 8),
}
LEARNED_CFG = osp.join(DEMO, 'vim-demo_pyramid_upernet_1xb8-600i_toyshapes-64x64_dynamicvit.py')
LEARNED_CKPT = osp.join(CKPTS, 'vim-demo-dynamicvit-seed0_toyshapes-64x64.pth')
TRAINING_FREE = [m for m in METHODS if m != 'learned']
#: the method each task runs through a tools/test.py subprocess (the others run in-process)
COMMAND_LINE = {'seg': 'top', 'det': 'evit', 'cls': 'top'}

HOOKED = """\
_base_ = [{base!r}]
custom_hooks = [dict(type='TokenReductionHook', reduction=dict(type='ToMe', ratio=0.46),
                     phases=('val', 'test'))]
"""


def _options(task: str, root: str) -> list:
    """``--cfg-options`` pointing the test data (and the COCO metric) at ``root``."""
    opts = [f'test_dataloader.dataset.data_root={root}', 'log_level=WARNING']
    if task == 'det':
        opts.append(f'test_evaluator.ann_file={root}/annotations/instances_val2017.json')
    return opts


@pytest.fixture(scope='module')
def setups(tmp_path_factory):
    """Per task: the data, the configs, and one sweep over every method (the rows by key)."""
    import amvim_mm.datasets as D
    base = tmp_path_factory.mktemp('test_reduce')
    out = {}
    for task, (config, ckpt, maker, num_val) in TASKS.items():
        root = str(getattr(D, maker)(str(base / f'data_{task}'), num_train=1, num_val=num_val))
        config, ckpt = osp.join(DEMO, config), osp.join(CKPTS, ckpt)
        models, names, methods = [(config, ckpt)], [task], TRAINING_FREE
        if task == 'seg':
            hooked = base / 'amvim-demo-hooked.py'
            hooked.write_text(HOOKED.format(base=config))
            models = [(str(hooked), ckpt), (LEARNED_CFG, LEARNED_CKPT)]
            names, methods = ['seg', 'seg-learned'], list(METHODS)
        ratios = [0, RATIO] if task == 'seg' else [RATIO]
        data = run_sweep(models, methods, ratios, str(base / f'sweep_{task}'), names=names,
                         cfg_options=dict(o.split('=', 1) for o in _options(task, root)),
                         progress=False, replicates=40)
        rows = {(r['model'], r['method'], r['ratio']): r for r in data['results']}
        out[task] = dict(root=root, config=config, ckpt=ckpt, rows=rows, base=base)
    return out


def _test_args(s: dict, task: str, config: str, ckpt: str, extra: list) -> list:
    return [config, ckpt, '--work-dir', str(s['base'] / 'work' / task), *extra,
            '--cfg-options', *_options(task, s['root'])]


def _in_process(args: list, capsys, monkeypatch) -> tuple:
    """``tools/test.py`` run here as its ``__main__`` block runs it: (rc, out, err)."""
    tool = e2e._load_tool('test')
    monkeypatch.setattr(sys, 'argv', ['test.py', *map(str, args)])
    capsys.readouterr()
    rc = run_cli(tool.main)
    out, err = capsys.readouterr()
    return rc, out, err


def _metric(row: dict, out: str) -> float:
    return e2e.printed_metrics(out)[row['metric_name']]


def _reduction(method: str, out: str):
    """The reducer config ``tools/test.py`` printed that it tested with."""
    found = re.findall(rf'^--reduce {method}: test with token reduction (.*?)(?: \(the config.*)?$',
                       out, flags=re.M)
    assert len(found) == 1, out[-3000:]
    return ast.literal_eval(found[0])


@pytest.mark.parametrize('task', list(TASKS))
def test_every_method_equals_its_sweep_cell(setups, task, capsys, monkeypatch):
    s = setups[task]
    for method in TRAINING_FREE:
        row = s['rows'][(task, method, RATIO)]
        args = _test_args(s, task, s['config'], s['ckpt'], ['--reduce', method,
                                                             '--ratio', str(RATIO)])
        if method == COMMAND_LINE[task]:
            _, out = e2e.run_tool(['test.py', *args], cwd=s['base'])
        else:
            rc, out, err = _in_process(args, capsys, monkeypatch)
            assert rc == 0, err[-3000:]
        assert _reduction(method, out) == row['reduction'], method
        assert _metric(row, out) == row['metric_library'], (task, method, row['reduction'])
    # EViT / ToP: a keep rate after blocks (ToP-ViM's Tiny blocks scaled to the 8 demo blocks)
    for method in ('evit', 'top'):
        red = s['rows'][(task, method, RATIO)]['reduction']
        assert sorted(red) == ['keep_rate', 'locations', 'type'] and red['locations'] == [2, 6]


def test_ratio_zero_is_no_reduction(setups, capsys, monkeypatch):
    """``--ratio 0``: the sweep's ratio-0 row (no reduction), which differs from 0.27's."""
    s = setups['seg']
    zero = s['rows'][('seg', 'evit', 0.0)]
    assert zero['reduction'] is None and zero['metric'] != s['rows'][('seg', 'evit', RATIO)][
        'metric']
    args = _test_args(s, 'seg', s['config'], s['ckpt'], ['--reduce', 'evit', '--ratio', '0'])
    rc, out, err = _in_process(args, capsys, monkeypatch)
    assert rc == 0, err[-3000:]
    assert _reduction('evit', out) is None and _metric(zero, out) == zero['metric_library']


def test_learned_equals_its_sweep_row(setups, capsys, monkeypatch):
    s = setups['seg']
    row = next(r for k, r in s['rows'].items() if k[:2] == ('seg-learned', 'learned'))
    assert row['reduction']['type'] == 'DynamicViT'
    args = _test_args(s, 'seg', LEARNED_CFG, LEARNED_CKPT, ['--reduce', 'learned'])
    rc, out, err = _in_process(args, capsys, monkeypatch)
    assert rc == 0, err[-3000:]
    assert _reduction('learned', out) == row['reduction']
    assert _metric(row, out) == row['metric_library']
    # another method on the learned config: the learned reducer is off, as in the sweep
    tome = s['rows'][('seg-learned', 'tome', RATIO)]
    args = _test_args(s, 'seg', LEARNED_CFG, LEARNED_CKPT, ['--reduce', 'tome',
                                                           '--ratio', str(RATIO)])
    rc, out, err = _in_process(args, capsys, monkeypatch)
    assert rc == 0, err[-3000:]
    assert _reduction('tome', out) == tome['reduction'] == dict(type='ToMe', ratio=RATIO)
    assert _metric(tome, out) == tome['metric_library'] != row['metric_library']


def test_config_hook_does_not_override_reduce(setups, capsys, monkeypatch):
    """A config's TokenReductionHook (ToMe 0.46) gives way to --reduce in test.py, as in the
    sweep (whose seg rows come from that config and equal test.py on the plain one above)."""
    s = setups['seg']
    row = s['rows'][('seg', 'random', RATIO)]
    assert row['reduction'] == dict(type='RandomPrune', ratio=RATIO, seed=0)
    hooked = str(s['base'] / 'amvim-demo-hooked.py')
    args = _test_args(s, 'seg', hooked, s['ckpt'], ['--reduce', 'random', '--ratio', str(RATIO),
                                                   '--seed', '0'])
    args[args.index('log_level=WARNING')] = 'log_level=INFO'
    rc, out, err = _in_process(args, capsys, monkeypatch)
    assert rc == 0, err[-3000:]
    assert ("--reduce random: test with token reduction {'type': 'RandomPrune', 'ratio': 0.27, "
            "'seed': 0} (the config's TokenReductionHook is not used)") in out, out[-3000:]
    assert 'TokenReductionHook: test with' not in out
    assert _metric(row, out) == row['metric_library']


@pytest.mark.parametrize('task', ['det', 'cls'])
def test_learned_without_a_learned_config_is_one_line(setups, task, capsys, monkeypatch):
    s = setups[task]
    rc, out, err = _in_process(_test_args(s, task, s['config'], s['ckpt'],
                                          ['--reduce', 'learned']), capsys, monkeypatch)
    assert rc == 2 and 'Traceback' not in err
    assert err.strip().splitlines() == [
        f"error: --reduce learned needs a config whose backbone carries a learned reducer, "
        f"e.g. configs/demo/*_dynamicvit.py with its fine-tuned checkpoint; {s['config']} "
        "has none"]
    with pytest.raises(ConfigError, match='learned reducer'):
        run_sweep([(s['config'], s['ckpt'])], ['learned'], [0], str(s['base'] / 'x'),
                  progress=False)


@pytest.mark.parametrize('extra,expect', [
    (['--reduce', 'learned', '--ratio', '0.27'], '--ratio does not apply to --reduce learned'),
    (['--ratio', '0.27'], '--reduce and --ratio go together'),
    (['--reduce', 'top'], '--reduce and --ratio go together'),
    (['--reduce', 'evit', '--ratio', '1.2'], 'ratio 1.2 is outside [0, 1)'),
    (['--reduce', 'tome', '--ratio', '0.27', '--seed', '1'],
     '--seed applies to --reduce random only'),
    (['--reduce', 'random', '--ratio', '0.27', '--locations', '2'],
     '--locations applies to --reduce evit / top only'),
])
def test_bad_reduce_combinations_are_one_line(extra, expect, capsys, monkeypatch, tmp_path):
    """Refused before any config or checkpoint is read."""
    rc, out, err = _in_process([tmp_path / 'none.py', tmp_path / 'none.pth', *extra], capsys,
                               monkeypatch)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith('error: ') and expect in lines[0], \
        err
