"""The dense benchmark suite (``tools/benchmark.py --suite dense``) on the CPU: the smoke run end
to end, the fused rows in Triton's interpreter, the time budget, the argument errors, and the
recipes it pins against the configs they come from."""
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from amvim_mm.bench import dense as DB
from amvim_mm.apis.cli import run_cli
from amvim_mm.errors import ConfigError
from amvim_mm.ops import cpu_ops

ROOT = Path(__file__).resolve().parents[1]
#: the scan backend a CPU forward reports: the compiled kernel where it is built
CPU_SCAN = 'cpu' if cpu_ops.status()[0] else 'torch'


def run_suite(out_dir, *args, interpret=False):
    """``tools/benchmark.py --suite dense --smoke`` in a subprocess on one thread; PYTHONPATH
    names this checkout (a worktree's environment may have another one installed)."""
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
    env.pop('TRITON_INTERPRET', None)
    if interpret:
        env['TRITON_INTERPRET'] = '1'
    return subprocess.run([sys.executable, 'tools/benchmark.py', '--suite', 'dense', '--smoke',
                           '--out-dir', str(out_dir), *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def case_key(r):
    return (r['workload'], r['model'], r['impl'], r['reduction'], r['res'], r['batch'])


def planned(workloads, sizes=DB.SMOKE):
    cases = DB.plan_cases(sizes, workloads, DB.ours_depth(sizes))
    return {(c.workload, DB.model_name(c.model, sizes), c.impl, c.reduction_name, c.res,
             c.batch) for c in cases}


def check_ratios(rows):
    """The ratio columns are the quotients of the rows' own images/s."""
    by = {case_key(r): r for r in rows}
    peer = {(r['workload'], r['res'], r['batch']): r for r in rows if r['impl'] == 'peer'}
    checked = 0
    for r in rows:
        if r['impl'] == 'peer':
            assert 'ours_over_peer' not in r and 'fused_over_unfused' not in r
            continue
        w, m, impl, red, res, b = case_key(r)
        p = peer[(w, res, b)]
        assert r['ours_over_peer'] == round(r['img_per_s'] / p['img_per_s'], 3)
        if impl in DB.GRAPH_IMPLS:
            plain = by[(w, m, 'unfused', red, res, b)]
            assert r['over_unfused_no_graphs'] == round(r['img_per_s'] / plain['img_per_s'], 3)
        base_impl = DB.GRAPH_IMPLS.get(impl, 'unfused')
        if impl != base_impl and base_impl is not None:
            base = by[(w, m, base_impl, red, res, b)]
            assert r['fused_over_unfused'] == round(r['img_per_s'] / base['img_per_s'], 3)
            checked += 1
        else:
            assert 'fused_over_unfused' not in r
        if red != 'none':
            base = by[(w, m, impl, 'none', res, b)]
            assert r['speedup_vs_unreduced'] == round(r['img_per_s'] / base['img_per_s'], 3)
    assert checked


def test_smoke_suite_end_to_end(tmp_path):
    """Every workload, model, path and reduction at tiny sizes on the CPU: all planned rows
    measured (the forced fused rows need Triton's interpreter: listed as skipped), positive
    numbers, the path that ran, ratios from the numbers; JSON and markdown written."""
    r = run_suite(tmp_path, '--budget-s', 900)     # the suite's own budget bounds its time
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / 'benchmark_dense.json').read_text())
    rows, skipped = res['rows'], res['skipped']
    assert res['suite'] == 'dense' and res['smoke'] is True and res['device'] == 'cpu'
    plan = planned(list(DB.WORKLOADS))
    assert {case_key(x) for x in rows} == {k for k in plan if k[2] != 'forced'}
    assert {case_key(x) for x in skipped} == {k for k in plan if k[2] == 'forced'}
    assert all('TRITON_INTERPRET=1' in x['reason'] for x in skipped)
    assert len(rows) == len({case_key(x) for x in rows})
    for x in rows:
        assert 'error' not in x, x
        assert x['img_per_s'] > 0 and x['ms_per_iter'] > 0 and x['spread_pct'] >= 0, x
        assert len(x['times_ms']) == res['sizes']['repeats'] and min(x['times_ms']) > 0
        assert x['dtype'] == 'bf16' and x['res'] > 0 and x['batch'] > 0
        assert x['mode'] == ('train-eager' if x['workload'] in DB.TRAINING else 'infer-eager')
        assert x['peak_mib'] is None          # CPU: not measured
        if x['impl'] == 'peer':
            assert x['path_ran'] == 'attention' and x['reduction'] == 'none'
        else:
            # the automatic choice on CPU tensors, and every unfused row: the unfused path
            assert x['path_ran'] == 'unfused', x
            assert re.fullmatch(r'0/\d+', x['fused_calls']) and 'path_note' not in x
            assert x['scan_backend'] == CPU_SCAN and x['conv_backend'] == 'torch'
        if x['reduction'].startswith('ToP'):
            assert x['token_counts'][-1] < x['token_counts'][0], x
        if x['workload'] == 'ade-slide':
            assert x['windows_per_forward'] == x['batch']
        if x['workload'] in ('ade-train', 'in1k'):
            assert x['optimizer'].startswith('AdamW')
    check_ratios(rows)
    md = (tmp_path / 'benchmark_dense.md').read_text()
    for w in DB.WORKLOADS:
        assert f'## {w}:' in md
    assert '## skipped' in md and 'CPU smoke run' in md
    assert r.stdout.count('] ade-train') == 9


@pytest.mark.slow
def test_forced_fused_rows_in_triton_interpreter(tmp_path):
    """``fused_mixer=True`` rows (plain and with ToMe) run the fused path in Triton's
    interpreter: the probe sees every mixer call fused, as many as the fused function ran."""
    r = run_suite(tmp_path, '--workloads', 'ade-whole', '--whole-sizes', '64:1',
                  interpret=True)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / 'benchmark_dense.json').read_text())
    rows = res['rows']
    assert not res['skipped']
    assert {case_key(x) for x in rows} == planned(['ade-whole'], dataclasses.replace(
        DB.SMOKE, whole=((64, 1), )))
    forced = [x for x in rows if x['impl'] == 'forced']
    assert len(forced) == 6
    for x in rows:
        assert 'error' not in x and x['img_per_s'] > 0, x
    for x in forced:
        n = x['fused_calls'].split('/')
        assert x['path_ran'] == 'fused' and n[0] == n[1] != '0' and 'path_note' not in x, x
    check_ratios(rows)


def test_budget_skips_rows_with_a_note(tmp_path):
    """A spent budget skips every remaining row and says so in the JSON and the markdown."""
    sizes, workloads = DB.SMOKE, ['in1k']
    suite = DB.DenseSuite(sizes=sizes, workloads=workloads, device='cpu', out_dir=str(tmp_path),
                          root=str(ROOT), command='test', budget_s=5, smoke=True,
                          log=lambda msg: None)
    suite.deadline = time.perf_counter()          # spent
    res = suite.run(DB.plan_cases(sizes, workloads, DB.ours_depth(sizes)))
    assert res['rows'] == [] and len(res['skipped']) == 9
    assert all(s['reason'].startswith('time budget') for s in res['skipped'])
    md = (tmp_path / 'benchmark_dense.md').read_text()
    assert '## skipped' in md and 'time budget' in md
    assert json.loads((tmp_path / 'benchmark_dense.json').read_text())['skipped']


def _main():
    spec = importlib.util.spec_from_file_location('_tool_benchmark', ROOT / 'tools/benchmark.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


@pytest.mark.parametrize('argv, message', [
    (['--smoke', '--workloads', 'ade', 'coco'], "unknown dense workload 'ade'"),
    (['--smoke', '--whole-sizes', '512x8'], 'expects RES:BATCH pairs'),
    (['--smoke', '--whole-sizes', '512:0'], 'expects RES:BATCH pairs'),
    (['--smoke', '--budget-s', 'soon'], '--budget-s expects a number >= 1'),
    (['--smoke', '--budget-s', '0'], '--budget-s expects a number >= 1'),
    (['--smoke', '--repeats', '1'], '--repeats must be at least 2'),
    (['--smoke', '--train-iters', '2.5'], '--train-iters expects a whole number'),
    (['--smoke', '--infer-modes', 'eager', 'fast'], "unknown inference mode 'fast'"),
    (['--smoke', '--dense-dtype', 'fp16'], "dense dtype must be 'bf16' or 'fp32'"),
])
def test_bad_arguments_give_a_short_error(argv, message, capsys, tmp_path):
    main = _main()
    rc = run_cli(lambda: main(['--suite', 'dense', '--out-dir', str(tmp_path)] + argv))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith('error: ') and message in err, err
    assert len(err.splitlines()) <= 2
    assert not list(tmp_path.iterdir())          # nothing written


def test_dense_options_belong_to_the_dense_suite(capsys):
    main = _main()
    for argv in (['--suite', 'cpu', '--smoke'], ['--suite', 'gpu', '--budget-s', '60']):
        rc = run_cli(lambda: main(argv))
        err = capsys.readouterr().err.strip()
        assert rc == 2 and err.startswith('error: ') and 'belongs to --suite dense' in err
        assert len(err.splitlines()) == 1


def test_dense_without_cuda_needs_smoke(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    rc = run_cli(lambda: _main()(['--suite', 'dense', '--out-dir', str(tmp_path)]))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and 'needs a CUDA device; --smoke runs it' in err
    assert len(err.splitlines()) == 1


def _plain(x):
    return json.loads(json.dumps(x))


def test_pinned_recipes_match_the_configs():
    """The COCO backbone + neck and the ImageNet recipe are pinned in the suite (the GPU job
    has no mmdet / mmpretrain): they must equal what the configs build."""
    pytest.importorskip('mmdet')
    pytest.importorskip('mmpretrain')
    from mmengine.config import Config
    for model, typ in (('vim', 'Vim'), ('amvim', 'AMVim')):
        cfg = Config.fromfile(str(ROOT / f'configs/{model}/{model}-t_sfp_mask-rcnn_8xb8-lsj-'
                                         '184k_coco-1024x1024.py'))
        backbone = _plain(cfg.model.backbone)
        backbone.pop('init_cfg')
        assert backbone == _plain(dict(DB.COCO_BACKBONE, type=typ))
        assert _plain(cfg.model.neck) == _plain(DB.COCO_NECK)
    cfg = Config.fromfile(str(ROOT / 'configs/amvim/amvim-t_linear_8xb128-150e_in1k-224.py'))
    backbone = _plain(cfg.model.backbone)
    backbone.pop('init_cfg')
    assert backbone == _plain(dict(DB.IN1K_BACKBONE, type='AMVim'))
    assert _plain(cfg.optim_wrapper) == _plain(DB.IN1K_OPTIM)
    head = cfg.model.head
    assert head.type == 'LinearClsHead' and head.num_classes == DB.IN1K_HEAD['num_classes']
    assert head.loss == dict(type='LabelSmoothLoss', mode='original',
                             label_smooth_val=DB.IN1K_HEAD['label_smooth_val'])
    # the dense configs' out_indices, which the peer's are scaled from
    for model in ('vim', 'amvim'):
        cfg = Config.fromfile(str(ROOT / DB.ADE_CONFIGS[model]))
        assert tuple(cfg.model.backbone.out_indices) == DB.quarter_indices(24)
        assert cfg.model.test_cfg.mode == 'slide'
        assert tuple(cfg.model.test_cfg.stride) == (DB.FULL.ade_stride, ) * 2
    assert DB.quarter_indices(12) == (2, 5, 8, 11)


def test_path_probe_summary():
    """The probe's verdicts: no call fused, some, all; a failed probe falls back on the count
    of the fused function's calls; a disagreement between the two is noted."""
    import torch
    from amvim_mm.registry import MODELS
    m = MODELS.build(dict(type='Vim', arch='test', img_size=32, out_type='featmap'))
    with torch.no_grad(), DB.PathProbe(m) as probe:
        m(torch.randn(1, 3, 32, 32))
    from amvim_mm.models.vim import mixer
    from amvim_mm.ops import fused_mixer
    assert mixer.fused_mixer_forward is fused_mixer.fused_mixer_forward       # restored
    assert not any(x._forward_pre_hooks for x in m.modules())
    s = probe.summary()
    assert s['path_ran'] == 'unfused' and s['fused_calls'] == '0/4' and 'path_note' not in s
    assert s['scan_backend'] == CPU_SCAN and s['conv_backend'] == 'torch'
    probe.decisions = [True, False, True, False]
    assert probe.summary()['path_ran'] == 'mixed'
    assert 'decisions say 2' in probe.summary()['path_note']
    probe.decisions, probe.kernel_calls = [True] * 4, 4
    assert probe.summary() == dict(fused_calls='4/4', path_ran='fused', scan_backend=CPU_SCAN,
                                   conv_backend='torch')
    probe.decisions, probe.errors = [None] * 4, ['AttributeError: x']
    s = probe.summary()
    assert s['path_ran'] == 'fused' and 'probe failed on 1 calls' in s['path_note']
    assert DB.PathProbe(torch.nn.Linear(2, 2)).summary() == dict(path_ran='attention')


def test_graph_mode_rows_planned_per_mode_and_skipped_without_cuda(tmp_path):
    """``infer_modes``: every inference row once per mode, training rows eager only; on the
    CPU the graph rows are skipped with the reason, the eager twins measured."""
    sizes = DB.SMOKE
    cases = DB.plan_cases(sizes, ['ade-backbone', 'ade-train'], DB.ours_depth(sizes),
                          infer_modes=('eager', 'graph'))
    train = [c for c in cases if c.workload == 'ade-train']
    backbone = [c for c in cases if c.workload == 'ade-backbone']
    assert train and {c.mode for c in train} == {'eager'}
    eager = [c for c in backbone if c.mode == 'eager']
    graph = [c for c in backbone if c.mode == 'graph']
    # the backbone-graph impls only in the eager pipeline (an outer graph would hold them)
    assert {c.impl for c in eager} - {c.impl for c in graph} == set(DB.GRAPH_IMPLS)
    eager = [c for c in eager if c.impl not in DB.GRAPH_IMPLS]
    assert len(eager) == len(graph) > 0
    strip = [(c.model, c.impl, c.res, c.batch, c.reduction_name) for c in eager]
    assert strip == [(c.model, c.impl, c.res, c.batch, c.reduction_name) for c in graph]
    # the backbone rows' sizes: the slide rows' and the whole rows', once each
    assert {(c.res, c.batch) for c in eager} == {(64, 1), (64, 2), (96, 1)}
    pick = [c for c in backbone if c.model == 'vim' and c.impl == 'unfused'
            and c.reduction is None and (c.res, c.batch) == (64, 1)]
    suite = DB.DenseSuite(sizes=sizes, workloads=['ade-backbone'], device='cpu',
                          out_dir=str(tmp_path), root=str(ROOT), command='test',
                          infer_modes=('eager', 'graph'), smoke=True, log=lambda m: None)
    res = suite.run(pick)
    assert [r['mode'] for r in res['rows']] == ['infer-eager']
    assert 'error' not in res['rows'][0] and res['rows'][0]['img_per_s'] > 0
    assert [(s['mode'], s['reason']) for s in res['skipped']] == [
        ('graph', 'CUDA graphs need a CUDA device')]
    assert res['infer_modes'] == ['eager', 'graph']


def test_ratios_within_one_mode_and_the_backbone_share():
    """Fused / unfused and ours / peer divide rows of the same mode only; ade-whole rows get
    the backbone's share of their time and the fused rows the ratio a free backbone gives."""
    def row(workload, impl, mode, ms, model='vim-t'):
        return dict(workload=workload, model=model, impl=impl, reduction='none', res=512,
                    batch=8, mode=f'infer-{mode}', ms_per_iter=ms, img_per_s=8000 / ms)
    rows = [row('ade-whole', 'auto', 'eager', 20.0), row('ade-whole', 'unfused', 'eager', 40.0),
            row('ade-whole', 'auto', 'graph', 10.0), row('ade-whole', 'unfused', 'graph', 12.0),
            row('ade-backbone', 'auto', 'graph', 4.0), row('ade-backbone', 'unfused', 'graph', 6.0),
            row('ade-whole', 'peer', 'graph', 8.0, model='peer')]
    DB.add_ratios(rows)
    eager_auto, _, graph_auto, graph_unfused, bb_auto, _, _ = rows
    assert eager_auto['fused_over_unfused'] == 2.0
    assert graph_auto['fused_over_unfused'] == 1.2
    assert graph_auto['ours_over_peer'] == 0.8 and 'ours_over_peer' not in eager_auto
    assert graph_auto['backbone_share'] == 0.4 and graph_unfused['backbone_share'] == 0.5
    assert graph_auto['ratio_cap'] == 2.0          # 12 ms / (12 - 6) ms outside the backbone
    assert 'ratio_cap' not in graph_unfused and 'backbone_share' not in eager_auto
    assert 'backbone_share' not in bb_auto and bb_auto['fused_over_unfused'] == 1.5


def test_reduced_whole_rows_report_backbone_whole_and_ceiling():
    """Issue 54: a reduced ade-whole row's speed-up three ways: the backbone alone (same
    reduction, ade-backbone rows), the whole model, and the ceiling (the unreduced model with
    its backbone's time scaled by the FLOPs ratio)."""
    def row(workload, reduction, ms, **kw):
        return dict(workload=workload, model='vim-t', impl='unfused', reduction=reduction,
                    res=512, batch=8, mode='infer-eager', ms_per_iter=ms, img_per_s=8000 / ms,
                    **kw)
    rows = [row('ade-whole', 'none', 40.0), row('ade-backbone', 'none', 20.0),
            row('ade-whole', 'tome-0.46', 32.0, flops_ratio=0.5),
            row('ade-backbone', 'tome-0.46', 12.5, flops_ratio=0.5)]
    DB.add_ratios(rows)
    whole = rows[2]
    assert whole['backbone_speedup'] == 1.6 and whole['speedup_vs_unreduced'] == 1.25
    assert whole['ceiling_speedup'] == round(40 / (40 - 20 * 0.5), 3)     # 1.333
    assert 'ceiling_speedup' not in rows[3] and 'backbone_speedup' not in rows[0]


def test_impls_option_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="unknown dense impl 'bogus'"):
        DB.run_dense(out_dir=str(tmp_path), root='.', command='x', smoke=True,
                     workloads=['ade-backbone'], impls=['auto', 'bogus'])


def test_fp32_rows_run_without_autocast(tmp_path, monkeypatch):
    """``dense_dtype='fp32'`` (mmseg's test tool on our configs): the rows say fp32 and no
    autocast region is entered."""
    import amvim_mm.bench.dense.suite as suite_mod
    entered = []
    real = suite_mod.autocast_for

    def spy(device, dtype):
        entered.append(dtype)
        return real(device, dtype)
    monkeypatch.setattr(suite_mod, 'autocast_for', spy)
    res = DB.run_dense(out_dir=str(tmp_path), root='.', command='x', smoke=True,
                       workloads=['ade-backbone'], impls=['auto'], dense_dtype='fp32')
    assert res['rows'] and all(r['dtype'] == 'fp32' and 'error' not in r for r in res['rows'])
    assert entered and set(entered) == {'fp32'}


def test_rows_differing_in_reduction_are_timed_in_interleaved_rounds(tmp_path, monkeypatch):
    """The inference rows of one model, impl and size (none, ToMe 0.17, ToMe 0.46) are timed
    round by round, each with its own reducer set (a drift of the host hits them alike); the
    rows still say which reduction ran (token counts) and carry one time per round."""
    import amvim_mm.bench.dense.suite as suite_mod
    seen = []
    real = suite_mod._timer

    def spy(call, iters, device):
        seen.append((suite.models[('ade', 'vim')][0].backbone.token_reducer, iters))
        return real(call, iters, device)
    monkeypatch.setattr(suite_mod, '_timer', spy)
    sizes = dataclasses.replace(DB.SMOKE, repeats=3, slide_batches=(1, ))
    cases = [c for c in DB.plan_cases(sizes, ['ade-backbone'], DB.ours_depth(sizes))
             if c.impl == 'auto' and c.model == 'vim']
    suite = DB.DenseSuite(sizes=sizes, workloads=['ade-backbone'], device='cpu',
                          out_dir=str(tmp_path), root=str(ROOT), command='test', smoke=True,
                          log=lambda msg: None)
    res = suite.run(cases)
    rows = res['rows']
    n_sizes = len({(c.res, c.batch) for c in cases})
    assert len(rows) == len(cases) == 3 * n_sizes
    names = [r['reduction'] for r in rows]
    assert names == ['none', 'ToMe 0.17', 'ToMe 0.46'] * n_sizes   # grouped per size
    reducers = [None if r is None else r.schedule.ratio for r, _ in seen]
    assert reducers == [None, 0.17, 0.46] * 3 * n_sizes              # round after round
    assert {i for _, i in seen} == {sizes.infer_iters}
    for r in rows:
        assert 'error' not in r, r
        assert len(r['times_ms']) == 3 and r['ms_per_iter'] > 0
        if r['reduction'] != 'none':
            assert r['token_counts'][-1] < r['token_counts'][0], r
            assert r['speedup_vs_unreduced'] > 0


def test_segmenter_rows_with_every_method_and_three_speedups(tmp_path):
    """Issue 54: ``models=['vim-segmenter']`` runs Segmenter's mask head on the kept tokens in
    the ADE20K inference workloads only (none of the training rows), reduced by each of
    ``methods`` at ``ratios`` (prune_eval's ratio -> reducer mapping: the importance methods'
    realised ratio near the asked one); its reduced whole and slide rows carry the backbone's
    speed-up, the whole model's and the ceiling."""
    sizes = DB.SMOKE
    cases = DB.plan_cases(sizes, list(DB.WORKLOADS), DB.ours_depth(sizes),
                          models=['vim-segmenter'],
                          reductions=[('tome', 0.46), ('evit', 0.3), ('top', 0.3)])
    assert {c.workload for c in cases} == {'ade-slide', 'ade-whole', 'ade-backbone'}
    assert {c.reduction_name for c in cases} == {'none', 'ToMe 0.46', 'EViT 0.3', 'ToP 0.3'}
    top = next(c for c in cases if c.reduction_name == 'ToP 0.3')
    assert top.reduction['type'] == 'ToP' and 0 < top.reduction['keep_rate'] < 1
    res = DB.run_dense(out_dir=str(tmp_path), root=str(ROOT), command='x', smoke=True,
                       workloads=['ade-backbone', 'ade-whole'], impls=['auto'],
                       models=['vim-segmenter'], methods=['tome', 'evit'],
                       ratios=['0.3'], whole_sizes='64:2', log=lambda msg: None)
    rows = res['rows']
    assert {r['model'] for r in rows} == {'vim-test segmenter-mask (tokens)'}
    assert len(rows) == 2 * 3 * 2 - 3    # backbone at 64:1 and 64:2, whole at 64:2; 3 rows each
    for r in rows:
        assert 'error' not in r, r
    for r in (r for r in rows if r['workload'] == 'ade-whole' and r['reduction'] != 'none'):
        assert r['token_counts'][-1] < r['token_counts'][0], r
        for k in ('backbone_speedup', 'speedup_vs_unreduced', 'ceiling_speedup'):
            assert r[k] > 0, (k, r)
    md = (tmp_path / 'benchmark_dense.md').read_text()
    assert 'segmenter-mask (tokens)' in md and 'ceiling_speedup' in md


@pytest.mark.parametrize('kw, message', [
    (dict(models=['vim', 'segformer']), "unknown dense model 'segformer'"),
    (dict(methods=['tome', 'dart']), "unknown reduction method 'dart'"),
    (dict(ratios=['0.5', '1.5']), '--ratios expects numbers between 0 and 1'),
    (dict(ratios=['half']), '--ratios expects a number'),
])
def test_model_and_method_options_are_checked(kw, message, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(message)):
        DB.run_dense(out_dir=str(tmp_path), root='.', command='x', smoke=True,
                     workloads=['ade-backbone'], **kw)
    assert not list(tmp_path.iterdir())
