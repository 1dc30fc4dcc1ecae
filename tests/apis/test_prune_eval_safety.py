"""``prune_eval``: concurrent sweeps into one out-dir, resuming keyed on checkpoint/config
content, and unusable out-dirs.

The sweeps run ``tools/prune_eval.py`` as subprocesses on the tiny ADE20K-layout data and the
``test``-architecture config of ``test_tools_e2e.py``; the checkpoints are untrained models
saved here (no training run needed), so the slow tests take seconds, not minutes.
"""
import json
import multiprocessing as mp
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest
import torch

from amvim_mm.apis.sweep import store as pe
from amvim_mm.testing import make_ade20k
from tests.test_tools_e2e import SEG_BASE, SEG_CONFIG, TOOLS, _env, write_config

CFG_NAME = 'vim-test_pyramid_upernet_1xb2-2i_ade20k-64x64.py'


# ------------------------------------------------------------------------------ fixtures
def _save_untrained(cfg_path, seed, out):
    """An mmengine-style checkpoint of the config's model, initialised with ``seed``."""
    from mmengine.registry import DefaultScope

    from amvim_mm.apis.runner import load_config
    from mmseg.registry import MODELS
    cfg = load_config(str(cfg_path), work_dir=str(osp.dirname(out)))
    torch.manual_seed(seed)
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg.model)
    model.init_weights()
    torch.save({'state_dict': model.state_dict(), 'meta': {}}, out)
    return out


@pytest.fixture(scope='module')
def seg(tmp_path_factory):
    root = tmp_path_factory.mktemp('pe_safety')
    data_root = make_ade20k(root / 'ade', num_train=2, num_val=2, seed=0)
    cfg = write_config(root / CFG_NAME, SEG_CONFIG.format(base=SEG_BASE, data_root=data_root))
    ck_a = _save_untrained(cfg, 0, str(root / 'model_a.pth'))
    ck_b = _save_untrained(cfg, 1, str(root / 'model_b.pth'))
    return dict(root=root, cfg=str(cfg), ck_a=ck_a, ck_b=ck_b)


def _cmd(*args):
    return [sys.executable, osp.join(TOOLS, 'prune_eval.py'), *[str(a) for a in args]]


def _run(args, cwd):
    env = _env()
    env['OMP_NUM_THREADS'] = '1'
    return subprocess.run(_cmd(*args), cwd=str(cwd), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=600)


def _rows(out_dir):
    return json.loads((out_dir / 'results.json').read_text())['results']


# ------------------------------------------------------------------- merge under the lock
def _writer(path, w, n, barrier):
    barrier.wait()
    for k in range(n):
        # each writer a model of its own, plus one shared model written with other methods
        rows = [dict(model=f'm{w}', method='tome', ratio=k / 100, metric=float(k),
                     checkpoint_sha256='c', config_sha256='f'),
                dict(model='shared', method=f'meth{w}', ratio=k / 100, metric=float(w + k),
                     checkpoint_sha256='c', config_sha256='f')]
        pe.merge_results(path, rows, meta=dict(writer=w))


def test_merge_results_concurrent_writers_keep_every_row(tmp_path):
    path = str(tmp_path / 'results.json')
    writers, n = 6, 15
    ctx = mp.get_context('fork')
    barrier = ctx.Barrier(writers)
    procs = [ctx.Process(target=_writer, args=(path, w, n, barrier)) for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * writers
    data = json.loads(open(path).read())
    keys = {(r['model'], r['method'], round(r['ratio'], 6)) for r in data['results']}
    expected = {(f'm{w}', 'tome', round(k / 100, 6)) for w in range(writers) for k in range(n)}
    expected |= {('shared', f'meth{w}', round(k / 100, 6))
                 for w in range(writers) for k in range(n)}
    assert keys == expected and len(data['results']) == 2 * writers * n
    # drops are computed from the merged rows
    for r in data['results']:
        assert r['drop'] == pytest.approx(r['ratio'] * 100, abs=1e-6)
    assert data['meta']['writer'] in range(writers)
    assert osp.isfile(path + '.lock')
    assert not [f for f in os.listdir(tmp_path) if f.endswith('.tmp')]


def test_merge_results_replaces_stale_rows_and_keeps_drop_baseline_of_same_checkpoint(tmp_path):
    path = str(tmp_path / 'results.json')
    old = dict(checkpoint_sha256='old', config_sha256='f')
    new = dict(checkpoint_sha256='new', config_sha256='f')
    pe.merge_results(path, [dict(model='a', method='tome', ratio=r, metric=50.0 - r * 10, **old)
                            for r in (0.0, 0.3, 0.5)]
                     + [dict(model='b', method='tome', ratio=0.0, metric=1.0, **old)])
    # a new checkpoint of model 'a': its old rows are stale (even the ratio it does not redo),
    # model 'b' is untouched; a new non-zero row without a new baseline has no drop
    data = pe.merge_results(path, [dict(model='a', method='tome', ratio=0.3, metric=10.0, **new)])
    rows = {(r['model'], r['ratio']): r for r in data['results']}
    assert set(rows) == {('a', 0.3), ('b', 0.0)}
    assert rows[('a', 0.3)]['checkpoint_sha256'] == 'new' and rows[('a', 0.3)]['drop'] is None
    data = pe.merge_results(path, [dict(model='a', method='random', ratio=0.0, metric=12.0,
                                        **new)])
    rows = {(r['model'], r['method'], r['ratio']): r for r in data['results']}
    # ratio 0 of another method is the baseline (ratio 0 is the same for every method)
    assert rows[('a', 'tome', 0.3)]['drop'] == pytest.approx(-2.0)
    assert rows[('a', 'random', 0.0)]['drop'] == 0
    assert json.loads(open(path).read()) == data


def test_a_sweep_never_deletes_rows_another_sweep_writes_meanwhile(tmp_path):
    """Issue 52, defect 7: two prune_eval runs into one out-dir with the same model name and
    different checkpoints deleted each other's rows as stale (both rc 0). A sweep may replace
    only the fingerprints stored when it started; a fingerprint written meanwhile stops it
    with one line, and nothing is deleted."""
    from amvim_mm.apis.sweep.store import stored_fingerprints
    from amvim_mm.errors import ConfigError
    path = str(tmp_path / 'results.json')
    first = dict(checkpoint_sha256='one', config_sha256='c')
    second = dict(checkpoint_sha256='two', config_sha256='c')
    older = dict(checkpoint_sha256='old', config_sha256='c')
    pe.merge_results(path, [dict(model='m', method='tome', ratio=0.0, metric=9.0, **older)])
    # both sweeps start now: each may replace the old checkpoint's rows, not each other's
    start_a = start_b = stored_fingerprints(path, ['m'])
    assert start_a == {'m': {('old', 'c')}}
    pe.merge_results(path, [dict(model='m', method='tome', ratio=0.0, metric=1.0, **first)],
                     replaceable=start_a)
    with pytest.raises(ConfigError, match="rows of model 'm' from another checkpoint") as err:
        pe.merge_results(path, [dict(model='m', method='tome', ratio=0.3, metric=2.0,
                                     **second)], replaceable=start_b)
    assert '\n' not in str(err.value)
    rows = pe.load_results(path)['results']
    assert [(r['checkpoint_sha256'], r['ratio']) for r in rows] == [('one', 0.0)]
    # run one after the other: the second sweep starts seeing the first's rows and replaces them
    pe.merge_results(path, [dict(model='m', method='tome', ratio=0.3, metric=2.0, **second)],
                     replaceable=stored_fingerprints(path, ['m']))
    rows = pe.load_results(path)['results']
    assert [(r['checkpoint_sha256'], r['ratio']) for r in rows] == [('two', 0.3)]


def test_reusable_splits_by_fingerprint():
    rows = [dict(model='a', method='tome', ratio=0.0, checkpoint_sha256='x', config_sha256='c'),
            dict(model='a', method='tome', ratio=0.3, checkpoint_sha256='y', config_sha256='c'),
            dict(model='a', method='tome', ratio=0.5),          # a row from before the hashes
            dict(model='z', method='tome', ratio=0.0, checkpoint_sha256='q', config_sha256='c')]
    done, stale = pe._reusable(rows, {'a': ('x', 'c')})
    assert list(done) == [('a', 'tome', 0.0, 'fp32')] and stale == {'a': 2}
    done, stale = pe._reusable(rows, {'a': ('x', 'other-config')})
    assert done == {} and stale == {'a': 3}


def test_rows_of_an_older_rule_are_recomputed(tmp_path):
    """Issue 52, defect 6a: EViT's rule changed (its fused token is read now). An EViT row
    stored before (no ``method_version``) must not be reused: it is recomputed and replaced,
    and the sweep says so; a row of the current rule and other methods' rows are reused."""
    fp = dict(checkpoint_sha256='x', config_sha256='c')
    rows = [dict(model='a', method='evit', ratio=0.3, **fp),
            dict(model='a', method='evit', ratio=0.5, method_version=2, **fp),
            dict(model='a', method='top', ratio=0.3, **fp)]
    done, stale = pe._reusable(rows, {'a': ('x', 'c')})
    assert sorted(done) == [('a', 'evit', 0.5, 'fp32'), ('a', 'top', 0.3, 'fp32')]
    assert stale == {}
    path = str(tmp_path / 'results.json')
    pe.merge_results(path, rows)
    assert pe.older_rule_rows(path, {'a': ('x', 'c')}) == {('a', 'evit'): 1}
    assert pe.older_rule_rows(path, {'a': ('y', 'c')}) == {}


def test_file_sha256_streams(tmp_path):
    import hashlib
    data = os.urandom(3 * 1024 + 17)
    (tmp_path / 'f').write_bytes(data)
    assert pe.file_sha256(str(tmp_path / 'f'), chunk=1000) == hashlib.sha256(data).hexdigest()


def test_config_sha256_ignores_work_dir_not_overrides(seg):
    from amvim_mm.apis.runner import load_config
    h = pe.config_sha256(load_config(seg['cfg'], work_dir='/tmp/x1'))
    assert h == pe.config_sha256(load_config(seg['cfg'], work_dir='/tmp/x2'))
    assert h != pe.config_sha256(load_config(seg['cfg'], {'model.decode_head.channels': 8}))


# -------------------------------------------------------------------------- bad out-dirs
def test_out_dir_is_a_file(seg, tmp_path):
    out = tmp_path / 'results_here'
    out.write_text('not a directory')
    proc = _run([seg['cfg'], seg['ck_a'], '--out-dir', out, '--ratios', '0'], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), proc.stderr
    assert 'not a directory' in lines[0] and str(out) in lines[0]
    assert 'Traceback' not in proc.stderr + proc.stdout
    assert out.read_text() == 'not a directory'


@pytest.mark.parametrize('sub', ['inside_a_file/out', 'readonly/out'])
def test_out_dir_cannot_be_created(seg, tmp_path, sub):
    (tmp_path / 'inside_a_file').write_text('x')
    ro = tmp_path / 'readonly'
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if sub.startswith('readonly') and os.access(ro, os.W_OK):
            pytest.skip('running as a user that may write into a read-only folder (root)')
        proc = _run([seg['cfg'], seg['ck_a'], '--out-dir', tmp_path / sub, '--ratios', '0'],
                    tmp_path)
    finally:
        ro.chmod(0o700)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: cannot create --out-dir'), lines
    assert 'Traceback' not in proc.stderr


def test_out_dir_permission_denied_in_process(seg, tmp_path, monkeypatch, capsys):
    """The same without relying on file modes (root may write into a 0500 folder)."""
    from tests.test_tools_e2e import _load_tool

    def denied(*args, **kwargs):
        raise PermissionError(13, 'Permission denied')
    monkeypatch.setattr(pe.os, 'makedirs', denied)
    rc = _load_tool('prune_eval').main([seg['cfg'], seg['ck_a'], '--ratios', '0', '--out-dir',
                                        str(tmp_path / 'denied')])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip() == f'error: cannot create --out-dir {tmp_path / "denied"}: ' \
        'Permission denied', err


def test_threads_must_be_positive(seg, tmp_path):
    proc = _run([seg['cfg'], seg['ck_a'], '--threads', '0'], tmp_path)
    assert proc.returncode == 2 and 'expected a positive integer' in proc.stderr
    assert 'Traceback' not in proc.stderr


# ----------------------------------------------------------------------- real sweeps
@pytest.mark.slow
def test_concurrent_sweeps_into_one_out_dir_keep_all_rows(seg, tmp_path):
    out_dir = tmp_path / 'pe'
    ratios = ['0', '0.2', '0.3', '0.4']
    procs = [subprocess.Popen(_cmd(seg['cfg'], seg['ck_a'], '--methods', method, '--ratios',
                                   *ratios, '--out-dir', out_dir, '--threads', '1'),
                              cwd=str(tmp_path), env=dict(_env(), OMP_NUM_THREADS='1'),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for method in ('tome', 'random')]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    rows = _rows(out_dir)
    assert {(r['model'], r['method'], r['ratio']) for r in rows} == {
        ('vim-test', m, float(r)) for m in ('tome', 'random') for r in ratios}
    assert len(rows) == 8
    sha = pe.file_sha256(seg['ck_a'])
    assert {r['checkpoint_sha256'] for r in rows} == {sha}
    assert len({r['config_sha256'] for r in rows}) == 1
    for r in rows:
        assert r['drop'] is not None
        if r['ratio'] == 0:
            assert r['drop'] == 0


@pytest.mark.slow
def test_other_checkpoint_with_same_name_is_recomputed(seg, tmp_path):
    out_dir = tmp_path / 'pe'
    ckpt = tmp_path / 'latest.pth'            # one path, retrained in between
    args = [seg['cfg'], ckpt, '--methods', 'tome', '--ratios', '0', '0.3', '--out-dir', out_dir,
            '--threads', '1']
    shutil.copyfile(seg['ck_a'], ckpt)
    proc = _run(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = {r['ratio']: r for r in _rows(out_dir)}
    sha_a, sha_b = pe.file_sha256(seg['ck_a']), pe.file_sha256(seg['ck_b'])
    assert sha_a != sha_b
    assert {r['checkpoint_sha256'] for r in first.values()} == {sha_a}

    # same command, same checkpoint: everything is reused
    proc = _run(args, tmp_path)
    assert proc.returncode == 0 and 'stale' not in proc.stderr, proc.stderr[-3000:]
    assert {r['ratio']: r for r in _rows(out_dir)} == first

    # another checkpoint under the same path and model name: recomputed, not reused
    shutil.copyfile(seg['ck_b'], ckpt)
    proc = _run(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 row(s) of 'vim-test'" in proc.stderr and 'stale' in proc.stderr, proc.stderr
    second = {r['ratio']: r for r in _rows(out_dir)}
    assert set(second) == {0.0, 0.3}
    for ratio, r in second.items():
        assert r['checkpoint_sha256'] == sha_b
        assert r['config_sha256'] == first[ratio]['config_sha256']
        assert r != first[ratio]
    assert second[0.3]['drop'] == pytest.approx(second[0.3]['metric'] - second[0.0]['metric'],
                                                abs=1e-3)
    # an override changes the config hash: recomputed as well
    proc = _run([*args, '--ratios', '0', '--cfg-options', 'model.decode_head.dropout_ratio=0.2'],
                tmp_path)
    assert proc.returncode == 0 and 'stale' in proc.stderr, proc.stderr[-3000:]
    third = _rows(out_dir)
    assert len(third) == 1 and third[0]['config_sha256'] != second[0.0]['config_sha256']
