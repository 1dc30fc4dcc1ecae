"""prune_eval's statistics and protocols on the demo checkpoints: every reducer, intervals,
paired differences, seeds, precision inside the test step, FLOPs conventions, and the
fp32-vs-bf16 decision check."""
import json
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch

from amvim_mm.models.reduction import ReductionSchedule
from tests.test_tools_e2e import TOOLS, _env

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = [(osp.join(ROOT, 'configs/demo', f'{m}-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py'),
         osp.join(ROOT, 'checkpoints/demo', f'{m}-demo-seed0_toyshapes-64x64.pth'))
        for m in ('vim', 'amvim')]


@pytest.fixture(scope='module')
def toy(tmp_path_factory):
    from amvim_mm.datasets import make_toy_shapes
    root = str(tmp_path_factory.mktemp('toy') / 'toy_shapes')
    make_toy_shapes(root, num_train=2, num_val=12)
    return [f'{k}.dataset.data_root={root}' for k in ('val_dataloader', 'test_dataloader')]


def _tool(name, args, cwd):
    env = _env()
    env['OMP_NUM_THREADS'] = '1'
    return subprocess.run([sys.executable, osp.join(TOOLS, name), *map(str, args)],
                          cwd=str(cwd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=900)


def test_contract_every_reducer_with_intervals_and_paired_differences(toy, tmp_path):
    """The acceptance command of the statistics issue, on the demo checkpoints."""
    out = tmp_path / 'D'
    args = [*DEMO[0], *DEMO[1], '--methods', 'tome', 'random', 'evit', 'top',
            '--ratios', '0', '0.27', '--out-dir', out, '--seeds', '0', '1',
            '--replicates', '300', '--cfg-options', *toy]
    p = _tool('prune_eval.py', args, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads((out / 'results.json').read_text())
    rows = data['results']
    assert len(rows) == 2 * 4 * 2
    for r in rows:
        assert {'model', 'method', 'ratio', 'metric'} <= set(r)
        assert isinstance(r['ci_low'], float) and isinstance(r['ci_high'], float)
        assert r['ci_low'] <= r['ci_high']
        assert r['ci_low'] - 0.01 <= r['metric'] <= r['ci_high'] + 0.01
        assert osp.isfile(out / r['stats_file'])
        if r['ratio'] == 0:
            assert r['drop'] == 0 and r['drop_ci_low'] == r['drop_ci_high'] == 0
            continue
        assert r['drop_ci_low'] <= r['drop'] + 0.01 and r['drop'] - 0.01 <= r['drop_ci_high']
        # EViT / ToP: a keep-rate schedule realising about the asked ratio, reported
        if r['method'] in ('evit', 'top'):
            assert set(r['reduction']) == {'type', 'keep_rate', 'locations'}
            assert r['reduction']['locations'] == [2, 6]      # ToP-ViM's Tiny, 8 blocks
            assert abs(r['realised_ratio'] - 0.27) < 0.02
        if r['method'] == 'random':
            assert len(r['metric_seeds']) == 2 and r['seeds'] == [0, 1]
            assert r['metric'] == pytest.approx(np.mean(r['metric_seeds']), abs=1e-4)
    pairs = data['paired_differences']
    assert {(p['method'], p['ratio']) for p in pairs} == {
        (m, 0.27) for m in ('tome', 'random', 'evit', 'top')}
    for d in pairs:
        assert (d['model_a'], d['model_b']) == ('vim-demo', 'amvim-demo')
        assert d['paired_difference'] == pytest.approx(d['drop_a'] - d['drop_b'], abs=1e-3)
        assert d['difference_ci_low'] <= d['paired_difference'] + 0.01
        assert d['paired_difference'] - 0.01 <= d['difference_ci_high']
    # one checkpoint per architecture: the checkpoint-level differences are the only
    # comparison, on the screen and in their file; no verdicts, so no forest plot
    assert 'Each pair of checkpoints on the same images' in p.stdout
    assert '| vim-demo | amvim-demo | tome | 0.27 | fp32 |' in p.stdout
    assert '| vim-demo | amvim-demo | tome | 0.27 | fp32 |' in (
        out / 'checkpoint_differences.md').read_text()
    assert 'Verdicts: no architecture verdicts' in (out / 'summary.md').read_text()
    assert not (out / 'prune_eval_forest.png').exists() and 'forest' not in p.stdout
    # the libraries' warnings go to the log, not into the progress bar
    assert 'UserWarning' not in p.stderr + p.stdout
    assert 'UserWarning' in (out / 'prune_eval_warnings.log').read_text()
    # resuming: nothing left to evaluate, the same numbers
    p2 = _tool('prune_eval.py', args, tmp_path)
    assert p2.returncode == 0, p2.stderr[-3000:]
    again = json.loads((out / 'results.json').read_text())
    assert [r['metric'] for r in again['results']] == [r['metric'] for r in rows]
    assert [r['ci_low'] for r in again['results']] == [r['ci_low'] for r in rows]


def test_pairing_shrinks_the_interval_of_a_difference():
    """The paired bootstrap of a difference between two correlated evaluations is narrower
    than what two independent intervals suggest (the point of pairing)."""
    from amvim_mm.analysis import stats as S
    rng = np.random.default_rng(0)
    hard = rng.random(200) < 0.3                  # images both models find hard
    a = dict(kind=np.array('cls'), correct=(~hard | (rng.random(200) < 0.2)).astype(float))
    b = dict(kind=np.array('cls'), correct=(~hard | (rng.random(200) < 0.1)).astype(float))
    w = S.bootstrap_weights(200, 500)
    va, vb = S.metric_values(a, w), S.metric_values(b, w)
    lo, hi = S.interval(va - vb)
    la, ha = S.interval(va)
    lb, hb = S.interval(vb)
    assert (hi - lo) < 0.8 * ((ha - la) + (hb - lb)) / 2


def test_amp_test_loop_applies_the_precision_inside_the_step(toy, tmp_path):
    from amvim_mm.apis.runner import load_config, load_model_weights, make_runner
    opts = dict(kv.split('=', 1) for kv in toy)
    cfg = load_config(DEMO[0][0], opts, work_dir=str(tmp_path / 'w'))
    cfg.test_cfg = dict(type='AmpTestLoop', precision='bf16')
    cfg.log_level = 'ERROR'
    runner = make_runner(cfg)
    load_model_weights(runner.model, DEMO[0][1])
    seen = []
    # a conv of the head: bf16 output only if autocast is really on inside the step
    runner.model.decode_head.conv_seg.register_forward_hook(
        lambda m, i, o: seen.append((torch.is_autocast_enabled('cpu'), o.dtype)))
    runner.test()
    assert seen and all(on and dt == torch.bfloat16 for on, dt in seen)
    seen.clear()
    runner.test_loop.precision = 'fp32'
    runner.test()
    assert seen and not any(on for on, _ in seen)
    assert all(dt == torch.float32 for _, dt in seen)
    with pytest.raises(ValueError, match='precision must be one of fp32, bf16, fp16'):
        from amvim_mm.engine.loops import AmpTestLoop
        AmpTestLoop(runner, runner.test_dataloader, [], precision='tf32')


def test_tome_matching_is_fp32_under_autocast():
    """Under bf16 autocast ToMe picks exactly the edges it picks in fp32 on the same streams
    (the similarity matmul no longer runs in bf16), with ties to the lower index."""
    from amvim_mm.models.layout.scan_context import ScanContext
    from amvim_mm.models.reduction.reducers import ToMe
    from amvim_mm.models.reduction.state import Streams, init_reduction_state
    torch.manual_seed(0)
    B, n, D, k = 4, 64, 48, 12
    base = torch.randn(B, n, D)
    x = base.clone()
    # many near-ties: B tokens that are tiny perturbations of their A neighbours
    x[:, 1::2] = base[:, 0::2] + 1e-3 * torch.randn(B, n // 2, D)
    hidden = x.to(torch.bfloat16)
    residual = x - hidden.float()
    layer = torch.nn.Module()
    layer.norm = torch.nn.Module()
    layer.norm.weight = torch.nn.Parameter(torch.rand(D) + 0.5)
    ctx = init_reduction_state(ScanContext((8, 8), cls_index=-1), B, 'cpu')
    red = ToMe(r=k, locations=(0, ))
    ref = red.select(0, k, Streams(hidden, residual), ctx, layer)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        low = red.select(0, k, Streams(hidden, residual), ctx, layer)
    assert torch.equal(ref[0], low[0]) and torch.equal(ref[1], low[1])
    # exact ties: identical scores go to the lower A index
    same = torch.ones(1, 8, 4)
    ctx1 = init_reduction_state(ScanContext((2, 4), cls_index=-1), 1, 'cpu')
    layer.norm.weight = torch.nn.Parameter(torch.ones(4))
    rem, dst, _ = red.select(0, 2, Streams(same, None), ctx1, layer)
    assert rem.tolist() == [[0, 2]] and dst.tolist() == [[1, 1]]


def test_precision_check_tool(toy, tmp_path):
    out = tmp_path / 'p.json'
    p = _tool('precision_check.py', [*DEMO[0], '--ratios', '0.46', '--precisions', 'fp32',
                                     'fp32', 'bf16', '--out', out, '--cfg-options', *toy],
              tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())['rows']
    assert [r['precision'] for r in rows] == ['fp32', 'fp32', 'bf16']
    # the same precision twice: every decision and the metric agree exactly
    assert rows[1]['edge_agreement'] == 1.0 and rows[1]['delta'] == 0
    assert 0.5 < rows[2]['edge_agreement'] <= 1.0 and rows[2]['edges'] == rows[1]['edges']
    assert '| tome | 0.46 | bf16 |' in p.stdout


def test_mmengine_flops_convention_is_mmengines_counter():
    from mmengine.analysis import get_model_complexity_info

    from amvim_mm.analysis.flops import vim_family_flops
    from amvim_mm.registry import MODELS
    m = MODELS.build(dict(type='Vim', arch='test', img_size=32, out_type='cls_token')).eval()
    ours = vim_family_flops(m, 32, None, convention='mmengine')
    info = get_model_complexity_info(m, inputs=(torch.zeros(1, 3, 32, 32), ),
                                     show_table=False, show_arch=False)
    assert ours['gflops'] * 1e9 == pytest.approx(info['flops'])
    red = vim_family_flops(m, 32, dict(type='ToMe', ratio=0.3), convention='mmengine')
    assert red['gflops'] < ours['gflops'] and m.token_reducer is None
    assert 'FlopAnalyzer' in ours['convention']


def test_importance_schedules_for_a_ratio():
    assert ReductionSchedule.importance_locations(24) == [9, 19]
    assert ReductionSchedule.importance_locations(8) == [2, 6]
    for M, depth in ((196, 24), (64, 8)):
        locs = ReductionSchedule.importance_locations(depth)
        for ratio in (0.17, 0.27, 0.46):
            keep = ReductionSchedule.keep_rate_for_ratio(ratio, M, depth, locs)
            rem = ReductionSchedule(keep_rate=keep, locations=tuple(locs)).removals(M, depth)
            assert abs(ReductionSchedule.realised_ratio(rem, M) - ratio) < 0.01


def _cls_row(tmp_path, model, ratio, correct):
    from amvim_mm.analysis import stats as S
    f = f'per_image/{model}_{ratio}.npz'
    (tmp_path / 'per_image').mkdir(exist_ok=True)
    st = dict(kind=np.array('cls'), correct=np.asarray(correct, dtype=float))
    (tmp_path / f).write_bytes(S.dumps([st], [f'img{i}' for i in range(len(correct))]))
    return dict(model=model, method='tome', ratio=ratio, precision='fp32',
                metric=100 * float(np.mean(correct)), metric_name='accuracy/top1',
                realised_ratio=ratio, gflops=1.0, stats_file=f, checkpoint_sha256=model,
                config_sha256='c')


def test_group_verdicts_over_training_seeds_and_images(tmp_path):
    """Two architectures x three training seeds: the group's value is the mean over its models
    with a t interval over seeds plus the image variance the seeds share (identical seeds: the
    image term alone, with t(2)); drops, relative drops, the robustness AUC and verdicts for
    the differences, paired over images, Holm-adjusted in one family (the cell and the AUC)
    with each interval at its verdict's level."""
    from scipy import stats as sps

    from amvim_mm.analysis import stats as S
    from amvim_mm.apis import sweep as pe
    rng = np.random.default_rng(0)
    n = 200
    base = rng.random(n) < 0.8
    drop_a = base & (rng.random(n) < 0.9)           # A loses ~10 % of its correct images
    drop_b = base & (rng.random(n) < 0.6)           # B loses ~40 %
    rows = [_cls_row(tmp_path, m, r, c) for m, r, c in (
        ('a0', 0.0, base), ('a0', 0.5, drop_a), ('a1', 0.0, base), ('a1', 0.5, drop_a),
        ('a2', 0.0, base), ('a2', 0.5, drop_a),
        ('b0', 0.0, base), ('b0', 0.5, drop_b), ('b1', 0.0, base), ('b1', 0.5, drop_b),
        ('b2', 0.0, base), ('b2', 0.5, drop_b))]
    meta = dict(models=['a0', 'a1', 'a2', 'b0', 'b1', 'b2'],
                groups=dict(a0='A', a1='A', a2='A', b0='B', b1='B', b2='B'))
    data = pe.merge_results(str(tmp_path / 'results.json'), rows, meta, out_dir=str(tmp_path),
                            replicates=400)
    single = next(r for r in data['results'] if r['model'] == 'a0' and r['ratio'] == 0.5)
    ga = next(g for g in data['group_results'] if g['group'] == 'A' and g['ratio'] == 0.5)
    assert ga['metric'] == pytest.approx(single['metric'], abs=1e-3)
    assert ga['drop'] == pytest.approx(single['drop'], abs=1e-3)
    boot = S.mean_over_seeds([dict(kind=np.array('cls'), correct=drop_a.astype(float))],
                             S.bootstrap_weights(n, 400, 0))
    half = sps.t.ppf(0.975, 2) * np.std(boot, ddof=1)
    assert ga['ci_high'] - ga['metric'] == pytest.approx(half, abs=2e-4)
    assert '3 training seeds' in ga['basis']
    assert ga['relative_drop'] == pytest.approx(100 * single['drop'] / (100 * base.mean()),
                                                abs=1e-3)
    assert ga['relative_drop_ci_low'] < ga['relative_drop'] < ga['relative_drop_ci_high']
    d = data['group_paired_differences']
    assert len(d) == 1 and (d[0]['group_a'], d[0]['group_b']) == ('A', 'B')
    assert d[0]['difference_ci_low'] > 0 and d[0]['verdict'] == 'A loses less'
    assert d[0]['reading'] == 'A loses less than B' and d[0]['family_size'] == 2
    assert d[0]['margin'] == 1.0 and d[0]['detectable'] > 0 and d[0]['df'] == 4
    assert d[0]['seeds'] == [3, 3]
    auc = {e['group']: e for e in data['group_auc']}
    assert auc['A']['kept'] == [1.0, 0.5]
    assert auc['A']['auc_drop'] == pytest.approx(ga['drop'] / 2, abs=1e-3)
    (ad, ) = data['group_auc_differences']
    assert ad['verdict'] == 'A loses less' and ad['auc_difference'] > 0
    assert ad['family_size'] == 2 and ad['kept_range'] == [0.5, 1.0]
    # both rejected: the intervals at Holm's two steps, Bonferroni 0.05 / 2 and 0.05 / 1
    assert sorted([d[0]['ci_level'], ad['ci_level']]) == pytest.approx([0.95, 0.975])
    table = pe.verdict_table(data)
    assert 'Robustness AUC' in table and '| A | B | tome | 0.50 |' in table
    assert 'A loses less than B' in table and '3 training seeds' in table
    assert 'Holm over 2 comparisons' in table
    assert '| A | 3 | tome | 0.50 |' in pe.group_table(data)


def test_without_groups_there_is_no_architecture_verdict(tmp_path):
    """No groups: every model is an architecture of one trained model, so no comparison gets
    a verdict (a single checkpoint says nothing about its architecture); the table says so,
    and the checkpoints' paired differences say they are checkpoint level."""
    from amvim_mm.analysis.verdicts import NO_VERDICT
    from amvim_mm.apis import sweep as pe
    rng = np.random.default_rng(1)
    base = rng.random(100) < 0.8
    rows = [_cls_row(tmp_path, m, r, c) for m, r, c in (
        ('a', 0.0, base), ('a', 0.5, base & (rng.random(100) < 0.9)),
        ('b', 0.0, base), ('b', 0.5, base & (rng.random(100) < 0.3)))]
    data = pe.merge_results(str(tmp_path / 'results.json'), rows, dict(models=['a', 'b']),
                            out_dir=str(tmp_path), replicates=200)
    (d, ) = data['group_paired_differences']
    assert d['verdict'] == NO_VERDICT and d['p'] is None and d['p_holm'] is None
    assert d['reading'] == 'one trained model: no architecture verdict'
    assert 'one trained model' in d['basis'] and d['seeds'] == [1, 1]
    (ad, ) = data['group_auc_differences']
    assert ad['verdict'] == NO_VERDICT
    table = pe.verdict_table(data)
    assert 'No architecture verdicts' in table and 'loses' not in table
    (pd, ) = data['paired_differences']         # b loses far more: resolved, checkpoint level
    assert pd['reading'] == 'a loses less than b (these checkpoints, unadjusted)'
    assert 'checkpoint level' in pe.markdown_table(data)


def test_zero_baseline_gives_null_relative_drops_and_strict_json(tmp_path):
    """Defect 5: a zero unreduced metric put NaN into the relative drop and results.json was
    written with NaN tokens. Now the relative drop is null with a reason and the file is
    strict JSON."""
    import json

    from amvim_mm.apis import sweep as pe
    rng = np.random.default_rng(2)
    zero = np.zeros(60, dtype=bool)
    rows = [_cls_row(tmp_path, m, r, c) for m, r, c in (
        ('a0', 0.0, zero), ('a0', 0.5, rng.random(60) < 0.1),
        ('a1', 0.0, zero), ('a1', 0.5, rng.random(60) < 0.1))]
    meta = dict(models=['a0', 'a1'], groups=dict(a0='A', a1='A'))
    path = tmp_path / 'results.json'
    data = pe.merge_results(str(path), rows, meta, out_dir=str(tmp_path), replicates=50)

    def refuse(token):
        raise ValueError(f'not strict JSON: {token}')
    strict = json.loads(path.read_text(), parse_constant=refuse)
    row = next(r for r in strict['results'] if r['model'] == 'a0' and r['ratio'] == 0.5)
    assert row['relative_drop'] is None and 'unreduced metric is 0' in row['relative_drop_reason']
    g = next(e for e in strict['group_results'] if e['ratio'] == 0.5)
    assert g['relative_drop'] is None and 'unreduced metric is 0' in g['relative_drop_reason']
    assert strict['group_auc'][0]['auc_relative_drop'] is None
    assert data['group_auc'][0]['auc_drop'] > 0
    assert pe.strict_json({'x': float('nan'), 'y': [np.float64('inf')], 'z': np.float32(1)}) \
        == {'x': None, 'x_null_reason': 'not a finite number (nan)', 'y': [None], 'z': 1.0}


def test_auc_comparison_over_the_common_kept_range(tmp_path):
    """Defect 6: architectures whose realised ratios differ (kept 0.5 vs 0.6 at the same
    nominal ratio) were compared by AUCs over different ranges; the comparison now covers
    the range both reach, the curve of the other interpolated at its lower end."""
    from amvim_mm.apis import sweep as pe
    rng = np.random.default_rng(5)
    n = 120
    base = rng.random(n) < 0.8
    rows = []
    for m, real in (('a0', 0.5), ('a1', 0.5), ('b0', 0.4), ('b1', 0.4)):
        rows.append(_cls_row(tmp_path, m, 0.0, base))
        r = _cls_row(tmp_path, m, 0.5, base & (rng.random(n) < 0.8))
        r['realised_ratio'] = real
        rows.append(r)
    meta = dict(models=['a0', 'a1', 'b0', 'b1'],
                groups=dict(a0='A', a1='A', b0='B', b1='B'))
    data = pe.merge_results(str(tmp_path / 'results.json'), rows, meta, out_dir=str(tmp_path),
                            replicates=100)
    (ad, ) = data['group_auc_differences']
    assert ad['kept_range'] == [0.6, 1.0]
    auc = {e['group']: e for e in data['group_auc']}
    assert auc['A']['kept'] == [1.0, 0.5] and auc['B']['kept'] == [1.0, 0.6]
    # A over [0.6, 1]: its drop interpolated at 0.6 is 0.8 of the drop at 0.5
    ga = next(e for e in data['group_results'] if e['group'] == 'A' and e['ratio'] == 0.5)
    assert ad['auc_drop_a'] == pytest.approx(ga['drop'] * 0.8 / 2, abs=1e-3)
    assert ad['auc_drop_b'] == pytest.approx(auc['B']['auc_drop'], abs=1e-3)
    assert ad['family_size'] == len(data['group_paired_differences']) + 1


def test_speed_flops_convention_and_precision_rows_side_by_side(toy, tmp_path):
    out = tmp_path / 'S'
    base = [*DEMO[0], '--methods', 'tome', '--ratios', '0', '0.46', '--out-dir', out,
            '--replicates', '100', '--cfg-options', *toy]
    p = _tool('prune_eval.py', [*base, '--measure-speed', '--flops-convention', 'mmengine'],
              tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads((out / 'results.json').read_text())['results']
    assert len(rows) == 2
    for r in rows:
        assert r['img_per_s'] > 0 and r['speed_batch'] == 8 and r['speed_device'] == 'cpu'
        assert r['img_per_s_model'] > 0 and r['speed_mode'] == 'eager'
        assert r['gflops_convention'] == 'mmengine' and r['precision'] == 'fp32'
    # issue 54: every speed-up three ways (backbone alone, whole model, ceiling)
    assert '| backbone img/s | backbone x | model img/s | model x | ceiling x |' in p.stdout
    assert "FlopAnalyzer" in p.stdout
    # a bf16 sweep into the same out-dir adds its rows next to the fp32 ones
    p = _tool('prune_eval.py', [*base, '--measure-speed', '--flops-convention', 'mmengine',
                                '--precision', 'bf16'], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads((out / 'results.json').read_text())['results']
    assert sorted((r['precision'], r['ratio']) for r in rows) == [
        ('bf16', 0.0), ('bf16', 0.46), ('fp32', 0.0), ('fp32', 0.46)]
    assert all(r['drop_ci_low'] is not None for r in rows)
    # another protocol (no speed measurement, another convention) recomputes, not reuses
    p = _tool('prune_eval.py', base, tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    fp32 = [r for r in json.loads((out / 'results.json').read_text())['results']
            if r['precision'] == 'fp32']
    assert all(r['gflops_convention'] == 'mamba' and 'img_per_s' not in r for r in fp32)


def test_jobs_evaluate_models_in_workers_with_the_same_rows(toy, tmp_path):
    """``--jobs 2``: two worker processes of one thread each (``--threads 2``), one model at a
    time per worker; the rows equal a one-process sweep's, the final pass runs in the parent
    (intervals, groups), and a second call resumes with nothing left to do."""
    common = [*DEMO[0], *DEMO[1], '--methods', 'tome', 'random', '--ratios', '0', '0.46',
              '--replicates', '200', '--threads', '2', '--cfg-options', *toy]
    one, two = tmp_path / 'one', tmp_path / 'two'
    p1 = _tool('prune_eval.py', [*common, '--out-dir', one], tmp_path)
    assert p1.returncode == 0, p1.stderr[-3000:]
    p2 = _tool('prune_eval.py', [*common, '--out-dir', two, '--jobs', '2'], tmp_path)
    assert p2.returncode == 0, p2.stderr[-3000:]
    rows = {}
    for tag, out in (('one', one), ('two', two)):
        data = json.loads((out / 'results.json').read_text())
        rows[tag] = {(r['model'], r['method'], r['ratio']): r for r in data['results']}
        assert len(rows[tag]) == 2 * 2 * 2
        assert len(data['paired_differences']) == 2          # the final pass ran
    for key, r in rows['one'].items():
        s = rows['two'][key]
        for field in ('metric', 'realised_ratio', 'gflops', 'drop', 'ci_low', 'ci_high'):
            assert s[field] == r[field], (key, field, s[field], r[field])
    before = json.loads((two / 'results.json').read_text())['results']
    again = _tool('prune_eval.py', [*common, '--out-dir', two, '--jobs', '2'], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((two / 'results.json').read_text())['results'] == before
    assert 'prune_eval: 100%' in again.stderr and '8/8' in again.stderr


def test_jobs_a_worker_error_ends_the_tool_in_one_line(toy, tmp_path):
    """A bad checkpoint of one model in a worker: exit 2 with the worker's one-line error."""
    bad = tmp_path / 'bad.pth'
    bad.write_bytes(b'not a checkpoint')
    args = [*DEMO[0], DEMO[1][0], bad, '--methods', 'tome', '--ratios', '0', '--threads', '2',
            '--jobs', '2', '--out-dir', tmp_path / 'D', '--cfg-options', *toy]
    p = _tool('prune_eval.py', args, tmp_path)
    assert p.returncode == 2, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith('error: ') and 'bad.pth' in last, p.stderr[-3000:]
    assert 'Traceback' not in p.stderr


def test_jobs_refuse_speed_measurements(toy, tmp_path):
    args = [*DEMO[0], *DEMO[1], '--methods', 'tome', '--ratios', '0', '--jobs', '2',
            '--measure-speed', '--out-dir', tmp_path / 'D', '--cfg-options', *toy]
    p = _tool('prune_eval.py', args, tmp_path)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == (
        'error: --measure-speed times every cell on this machine: run it with --jobs 1 '
        '(workers running side by side would slow each other down)')


@pytest.mark.parametrize('method,depth,patches', [('evit', 24, 196), ('top', 24, 196),
                                                  ('top', 8, 64)])
def test_an_unreachable_importance_ratio_is_refused(method, depth, patches):
    """Issue 52: ``--ratio 0.99`` for EViT / ToP silently became about 0.55 / 0.85 (pruning
    after two blocks cannot remove more); now a one-line error names the reachable ratio."""
    from amvim_mm.apis.sweep.methods import reduction_config
    from amvim_mm.errors import ConfigError
    with pytest.raises(ConfigError, match=r'ratio 0\.99 is out of reach .* nearest reachable'):
        reduction_config(method, 0.99, patches, depth)
    cfg = reduction_config(method, 0.46, patches, depth)
    rem = ReductionSchedule(keep_rate=cfg['keep_rate'],
                            locations=tuple(cfg['locations'])).removals(patches, depth)
    assert abs(ReductionSchedule.realised_ratio(rem, patches) - 0.46) <= 0.05


@pytest.mark.parametrize('row,expect', [
    ({'method': 'tome', 'ratio': 0.2}, "row 0 has no text 'model'"),
    ({'model': 'a', 'method': 'tome', 'ratio': 'abc'}, "row 0 has ratio 'abc'"),
    ({'model': 'a', 'method': 'tome', 'ratio': 1.5}, 'row 0 has ratio 1.5'),
    ([1, 2], 'row 0 is a list')])
def test_a_malformed_results_row_is_one_line(tmp_path, row, expect):
    """Issue 52, defect 8: a results.json row without ``model`` or with ratio "abc" ended in a
    KeyError / ValueError traceback."""
    from amvim_mm.apis import sweep as pe
    from amvim_mm.errors import ConfigError
    path = tmp_path / 'results.json'
    path.write_text(json.dumps({'results': [row]}))
    with pytest.raises(ConfigError, match=expect) as err:
        pe.load_results(str(path))
    assert '\n' not in str(err.value)


@pytest.mark.parametrize('content', [b'', b'PK\x03\x04 truncated', b'garbage'])
def test_an_unreadable_stats_file_is_one_line(tmp_path, content):
    """Issue 52, defect 8: a truncated or garbage per-image statistics file ended in a
    BadZipFile traceback in the final pass."""
    from amvim_mm.apis import sweep as pe
    from amvim_mm.errors import ConfigError
    rows = [_cls_row(tmp_path, 'a', 0.0, np.ones(10, bool)),
            _cls_row(tmp_path, 'a', 0.5, np.ones(10, bool))]
    (tmp_path / rows[1]['stats_file']).write_bytes(content)
    with pytest.raises(ConfigError, match='per-image statistics file is unreadable') as err:
        pe.merge_results(str(tmp_path / 'results.json'), rows, dict(models=['a']),
                         out_dir=str(tmp_path), replicates=40)
    assert '\n' not in str(err.value)


@pytest.mark.parametrize('edit', ['metric', 'stats'])
def test_a_row_edited_after_its_evaluation_is_refused(tmp_path, edit):
    """Issue 52, defect 7: a results.json metric or a per-image statistics file edited between
    runs was reused with an interval that no longer contained its value."""
    from amvim_mm.apis import sweep as pe
    from amvim_mm.errors import ConfigError
    rng = np.random.default_rng(3)
    base = rng.random(50) < 0.7
    rows = [_cls_row(tmp_path, 'a', 0.0, base),
            _cls_row(tmp_path, 'a', 0.5, base & (rng.random(50) < 0.8))]
    path = str(tmp_path / 'results.json')
    pe.merge_results(path, rows, dict(models=['a']), out_dir=str(tmp_path), replicates=40)
    if edit == 'metric':
        data = json.loads(open(path).read())
        data['results'][1]['metric'] += 5.0
        open(path, 'w').write(json.dumps(data))
    else:
        other = _cls_row(tmp_path, 'x', 0.5, ~base)          # another file's statistics
        (tmp_path / rows[1]['stats_file']).write_bytes(
            (tmp_path / other['stats_file']).read_bytes())
    with pytest.raises(ConfigError, match='was changed after the evaluation') as err:
        pe.merge_results(path, [], dict(models=['a']), out_dir=str(tmp_path), replicates=40)
    assert '\n' not in str(err.value)


def test_groups_summary_forest_plot_and_the_screen_verdicts_first(toy, tmp_path):
    """Two architectures x two training seeds (the shipped demo checkpoints): the screen
    starts with the verdicts, the checkpoint-level differences go to their file only,
    summary.md and the forest plot are written, and the plot's intervals (read back from the
    PNG) are the summary table's."""
    import re

    from amvim_mm.apis.sweep import drawn
    pairs, groups = [], []
    for m in ('vim', 'amvim'):
        for seed in (0, 1):
            pairs += [osp.join(ROOT, 'configs/demo',
                               f'{m}-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py'),
                      osp.join(ROOT, 'checkpoints/demo',
                               f'{m}-demo-seed{seed}_toyshapes-64x64.pth')]
            groups.append(m)
    out = tmp_path / 'G'
    p = _tool('prune_eval.py', [*pairs, '--methods', 'tome', '--ratios', '0', '0.46',
                                '--names', 'v0', 'v1', 'a0', 'a1', '--groups', *groups,
                                '--out-dir', out, '--replicates', '200', '--cfg-options', *toy],
              tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    screen = p.stdout
    assert 0 == screen.index('Robustness AUC') < screen.index('| group | models |') \
        < screen.index('| model | method |')
    assert 'Each pair of checkpoints' not in screen and 'UserWarning' not in p.stderr
    assert '| v0 | v1 | tome | 0.46 |' in (out / 'checkpoint_differences.md').read_text()
    summary = (out / 'summary.md').read_text()
    assert summary.startswith('# prune_eval\n') and 'Run: `python tools/prune_eval.py' in summary
    assert summary.index('Verdicts: one Holm family of 2') < summary.index(
        'Robustness AUC') < summary.index('Per cell:') < summary.index(
        'What the intervals rest on:') < summary.index('per checkpoint')
    forest = drawn(str(out / 'prune_eval_forest.png'))
    assert forest['kind'] == 'forest' and forest['margin'] == 1.0
    assert [r['label'] for r in forest['rows']] == ['vim - amvim | tome AUC',
                                                    'vim - amvim | tome 0.46']
    # the summary shows each difference as amvim - vim: the negated value and interval
    auc_row = next(line for line in summary.splitlines() if line.startswith('| tome |'))
    cell_row = next(line for line in summary.splitlines() if line.startswith('| tome | 0.46'))
    for row, line in zip(forest['rows'], (auc_row, cell_row), strict=True):
        num = r'([+-]?\d+\.\d+)'
        value, lo, hi = map(float, re.search(num + r' \[' + num + ', ' + num + r'\] (?:vim|'
                                             r'equiv|incon)', line).groups())
        assert value == pytest.approx(-row['value'], abs=0.006)
        assert (lo, hi) == (pytest.approx(-row['high'], abs=0.006),
                            pytest.approx(-row['low'], abs=0.006))
        assert row['verdict'] in ('A loses less', 'A loses more', 'equivalent', 'inconclusive')
    plot = drawn(str(out / 'prune_eval.png'))
    assert plot['kind'] == 'per architecture'
    assert {(line['label'], tuple(line['models'])) for line in plot['lines']} == {
        ('vim / tome', ('v0', 'v1')), ('amvim / tome', ('a0', 'a1'))}
