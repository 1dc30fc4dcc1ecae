"""prune_eval at the scale of a study: one pass over the data per model, and the distributed run.

* One pass (the default) gives the rows and per-image files of cell-by-cell evaluation, bit for
  bit on the CPU, for every method (ratio 0 included, random with two seeds), segmentation and
  classification.
* ``torchrun --nproc_per_node=2 tools/prune_eval.py ... --launcher pytorch`` (gloo on the CPU)
  writes the files a single process writes (``results.json`` equal but the timings, the
  per-image files byte for byte); ``tools/test.py --reduce`` gives the single process's metric.
* Killed under the launcher while the second model runs, the sweep keeps the first model's
  rows and no partial row; the same command resumes and completes with the same rows.
"""
import filecmp
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest

from amvim_mm.apis.sweep import run_sweep

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOOLS = osp.join(ROOT, 'tools')
SEG = [(osp.join(ROOT, 'configs/demo', f'{m}-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py'),
        osp.join(ROOT, 'checkpoints/demo', f'{m}-demo-seed0_toyshapes-64x64.pth'))
       for m in ('vim', 'amvim')]
CLS = (osp.join(ROOT, 'configs/demo/vim-demo_linear_1xb8-2k_toyshapes-64x64.py'),
       osp.join(ROOT, 'checkpoints/demo/vim-demo-cls-seed0_toyshapes-64x64.pth'))
METHODS = ['tome', 'random', 'evit', 'top']
SWEEP = dict(methods=METHODS, ratios=[0, 0.27], seeds=[0, 1], replicates=50, progress=False)


def _opts(root):
    return {f'{k}.dataset.data_root': root for k in ('val_dataloader', 'test_dataloader')}


@pytest.fixture(scope='module')
def seg_data(tmp_path_factory):
    from amvim_mm.datasets import make_toy_shapes
    root = str(tmp_path_factory.mktemp('toy') / 'toy_shapes')
    make_toy_shapes(root, num_train=2, num_val=13)       # odd: the sampler pads one rank
    return root


@pytest.fixture(scope='module')
def seg_single(seg_data, tmp_path_factory):
    """The single-process, cell-by-cell sweep of the Vim demo model (the reference)."""
    out = str(tmp_path_factory.mktemp('single') / 'out')
    run_sweep([SEG[0]], out_dir=out, cfg_options=_opts(seg_data), one_pass=False, **SWEEP)
    return out


def _rows(out):
    data = json.loads(open(osp.join(out, 'results.json')).read())
    for r in data['results']:
        r.pop('seconds')
        r.pop('img_per_s_test_loop', None)
    return data


def _assert_same_files(a, b):
    da, db = _rows(a), _rows(b)
    assert da['results'] == db['results']
    assert {k: v for k, v in da.items() if k != 'meta'} == \
        {k: v for k, v in db.items() if k != 'meta'}
    files = {r['stats_file'] for r in da['results']}
    assert len(files) == 5          # ratio 0 once, four methods at 0.27
    for f in files:
        assert filecmp.cmp(osp.join(a, f), osp.join(b, f), shallow=False), f


def test_one_pass_equals_cell_by_cell_segmentation(seg_data, seg_single, tmp_path):
    out = str(tmp_path / 'one_pass')
    run_sweep([SEG[0]], out_dir=out, cfg_options=_opts(seg_data), one_pass=True, **SWEEP)
    _assert_same_files(seg_single, out)
    rows = _rows(out)['results']
    assert {(r['method'], r['ratio']) for r in rows} == {(m, r) for m in METHODS
                                                         for r in (0.0, 0.27)}
    assert next(r for r in rows if r['method'] == 'random' and r['ratio'] == 0.27)['seeds'] \
        == [0, 1]


def test_one_pass_equals_cell_by_cell_classification(tmp_path):
    from amvim_mm.datasets import make_toy_shapes_cls
    root = str(tmp_path / 'toy_cls')
    make_toy_shapes_cls(root, num_train=2, num_val=12)
    outs = {}
    for one_pass in (True, False):
        outs[one_pass] = str(tmp_path / f'out_{one_pass}')
        run_sweep([CLS], out_dir=outs[one_pass], cfg_options=_opts(root), one_pass=one_pass,
                  **SWEEP)
    _assert_same_files(outs[True], outs[False])


def _env():
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore')
    env['PYTHONPATH'] = ROOT + os.pathsep + env.get('PYTHONPATH', '')
    return env


def _torchrun(port, script, args, **kw):
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
           f'--master_port={port}', osp.join(TOOLS, script), *map(str, args),
           '--launcher', 'pytorch']
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def _descendants(pid):
    """The process ids below ``pid`` (from /proc)."""
    children = {}
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                stat = open(f'/proc/{entry}/stat').read()
            except OSError:
                continue
            ppid = int(stat.rsplit(')', 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _sweep_args(models, out, data):
    args = [p for pair in models for p in pair]
    return [*args, '--methods', *METHODS, '--ratios', '0', '0.27', '--seeds', '0', '1',
            '--replicates', '50', '--out-dir', out, '--cfg-options',
            *[f'{k}={v}' for k, v in _opts(data).items()]]


def test_prune_eval_under_torchrun_equals_one_process(seg_data, seg_single, tmp_path):
    out = str(tmp_path / 'dist')
    p = _torchrun(29611, 'prune_eval.py', _sweep_args([SEG[0]], out, seg_data))
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, stderr[-3000:]
    assert stdout.count('results: ') == 1      # rank 0 alone prints
    _assert_same_files(seg_single, out)


def test_test_tool_under_torchrun_gives_the_sweeps_metric(seg_data, seg_single, tmp_path):
    p = _torchrun(29612, 'test.py', [*SEG[0], '--reduce', 'random', '--ratio', '0.27',
                                     '--seed', '1', '--work-dir', tmp_path / 'w',
                                     '--cfg-options',
                                     *[f'{k}={v}' for k, v in _opts(seg_data).items()]])
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, stderr[-3000:]
    line = [ln for ln in stdout.splitlines() if ln.startswith('{')]
    assert len(line) == 1
    row = next(r for r in _rows(seg_single)['results']
               if r['method'] == 'random' and r['ratio'] == 0.27)
    assert eval(line[0])['mIoU'] == pytest.approx(row['metric_seeds'][1], abs=0.006)


def test_killed_under_torchrun_keeps_whole_rows_and_resumes(seg_data, seg_single, tmp_path):
    """SIGKILL to every process of the launcher once the first model's rows are merged (the
    second model is then evaluating): no row of the second model, the first's complete; the
    same command resumes, keeps the first model's rows and adds the second's."""
    out = str(tmp_path / 'killed')
    args = _sweep_args(SEG, out, seg_data)
    p = _torchrun(29613, 'prune_eval.py', args)
    results = osp.join(out, 'results.json')
    deadline = time.time() + 500
    while time.time() < deadline and p.poll() is None:
        if osp.isfile(results) and json.load(open(results))['results']:
            break
        time.sleep(0.2)
    assert p.poll() is None, 'the sweep ended before it could be killed'
    for pid in [p.pid, *_descendants(p.pid)]:      # torchrun's workers have their own sessions
        os.kill(pid, signal.SIGKILL)
    p.communicate(timeout=60)
    rows = json.load(open(results))['results']
    assert {r['model'] for r in rows} == {'vim-demo'} and len(rows) == 8
    first = {(r['method'], r['ratio']): r['stats_file'] for r in rows}
    again = _torchrun(29614, 'prune_eval.py', args)
    stdout, stderr = again.communicate(timeout=600)
    assert again.returncode == 0, stderr[-3000:]
    rows = json.load(open(results))['results']
    assert len(rows) == 16 and {r['model'] for r in rows} == {'vim-demo', 'amvim-demo'}
    vim = [r for r in _rows(out)['results'] if r['model'] == 'vim-demo']
    assert vim == _rows(seg_single)['results']
    assert {(r['method'], r['ratio']): r['stats_file'] for r in rows
            if r['model'] == 'vim-demo'} == first


def test_init_launcher_on_a_gpu_machine_uses_mmengine_with_nccl(monkeypatch):
    """With CUDA the process group is mmengine's ``init_dist`` (NCCL, the device pinned by
    it), its timeout in seconds as mmengine takes it (a timedelta made it raise)."""
    import mmengine.dist
    import torch

    from amvim_mm.apis import dist
    calls = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(mmengine.dist, 'init_dist', lambda *a, **k: calls.append((a, k)))
    monkeypatch.setenv('RANK', '0')
    assert dist.init_launcher('pytorch', timeout_s=600)
    assert calls == [(('pytorch', ), dict(backend='nccl', timeout=600))]
    assert not dist.init_launcher('none')


def test_a_pass_too_large_for_memory_runs_cell_by_cell(seg_data, seg_single, tmp_path,
                                                       monkeypatch, capsys):
    """The default one pass estimates its evaluators' state (mIoU: 4 float64 areas per class
    and image); over a quarter of the available memory it says so and runs cell by cell, with
    the same rows."""
    from amvim_mm.apis.sweep import one_pass
    monkeypatch.setattr(one_pass, 'available_memory', lambda: 1000)
    out = str(tmp_path / 'fallback')
    run_sweep([SEG[0]], out_dir=out, cfg_options=_opts(seg_data), **SWEEP)
    err = capsys.readouterr().err
    assert 'evaluating cell by cell' in err and '6 evaluations x 13 images' in err
    _assert_same_files(seg_single, out)
    monkeypatch.setattr(one_pass, 'available_memory', lambda: 10 ** 12)

    class Runner:
        class test_dataloader:
            dataset = type('D', (), {'metainfo': {'classes': list(range(150))},
                                     '__len__': lambda self: 2000})()
        cfg = {'test_evaluator': dict(type='IoUMetric')}
    assert one_pass.pass_fits(Runner, 19) == (True, '')
    monkeypatch.setattr(one_pass, 'available_memory', lambda: 4 * 150 * 32 * 2000 * 19 - 1)
    assert not one_pass.pass_fits(Runner, 19)[0]


def test_the_sweep_takes_the_label_map_on_a_gpu_only(monkeypatch):
    """On a GPU the sweep's segmentor computes labels with the label map without class chunks
    (fp32: the fused kernel; else mmseg's whole resize, no resized logits kept); on a CPU
    mmseg's own post-processing stays."""
    import torch
    from mmengine.registry import DefaultScope

    from amvim_mm.apis.runner import load_config
    from amvim_mm.apis.sweep import run as sweep_run
    from amvim_mm.models.segmentors import uses_label_map
    from amvim_mm.registry import MODELS
    cfg = load_config(SEG[0][0])
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg.model)
    sweep_run._fused_label_maps(model)
    assert not uses_label_map(model)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    sweep_run._fused_label_maps(model)
    assert uses_label_map(model) and model.postprocess_result.keywords['chunk'] >= 2 ** 30
