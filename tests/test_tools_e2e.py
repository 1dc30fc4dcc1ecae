"""End to end through the command-line tools, as a user runs them (subprocesses, tiny data).

Each task takes a shipped config and a small config file next to the data that only *extends*
it (``_base_ = ['/abs/path/configs/...']``) with CPU-sized overrides: the ``test`` architecture,
64x64 (128x128 for detection) pipelines, batch 2, no worker processes, 2 iterations. The
commands run with the temporary folder as working directory and the default work dir
(``./work_dirs/<config name>``), which is where our loader trusts training checkpoints.

* segmentation: ``tools/train.py`` (2 iterations with validation) -> ``--resume`` to 3 ->
  ``tools/test.py`` prints mIoU, also with ``--reduce tome --ratio 0.17``;
  ``tools/prune_eval.py`` on Vim and AMVim (same checkpoint) with table, JSON, plot, resuming
  and bad inputs;
* detection: Mask R-CNN train 2 iterations + test with COCO bbox and segm AP;
* classification: train 2 iterations + test (top-1), and ``tools/test.py`` on an
  official-format Vim classifier file (converted on the fly);
* ``tools/demo.py --quick``.
"""
import ast
import importlib.util
import json
import os
import os.path as osp
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from amvim_mm.testing import make_ade20k, make_coco, make_imagenet

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOOLS = osp.join(ROOT, 'tools')
SEG_BASE = osp.join(ROOT, 'configs/vim/vim-t_pyramid_upernet_8xb2-160k_ade20k-512x512_paper-text.py')
DET_BASE = osp.join(ROOT, 'configs/vim/vim-t_sfp_mask-rcnn_8xb8-lsj-184k_coco-1024x1024.py')
CLS_BASE = osp.join(ROOT, 'configs/vim/vim-t_linear_8xb128-300e_in1k-224.py')

pytestmark = [pytest.mark.slow]


# ------------------------------------------------------------------------------- helpers
def _env():
    env = dict(os.environ)
    # hermetic trust: only ./work_dirs of the test's folder and the runs' own work dirs
    env.pop('AMVIM_TRUSTED_DIRS', None)
    env.pop('AMVIM_ALLOW_UNSAFE_LOAD', None)
    env['PYTHONUNBUFFERED'] = '1'
    # one OpenMP thread per tool process: with other torch processes on the same 2 cores,
    # spinning OpenMP threads make a 4-iteration training ~10x slower
    env.setdefault('OMP_NUM_THREADS', '1')
    return env


def run_tool(args, cwd, check=True, timeout=600):
    """``python tools/<args>`` in ``cwd``; returns (returncode, stdout + stderr)."""
    cmd = [sys.executable, osp.join(TOOLS, args[0]), *[str(a) for a in args[1:]]]
    proc = subprocess.run(cmd, cwd=str(cwd), env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f'{" ".join(cmd)} exited {proc.returncode}:\n{proc.stdout[-6000:]}')
    return proc.returncode, proc.stdout


def _metrics_line(out):
    lines = [ln.strip() for ln in out.splitlines()
             if ln.strip().startswith('{') and ln.strip().endswith('}')]
    assert lines, f'no metrics dict printed:\n{out[-3000:]}'
    return lines[-1]


def printed_metrics(out):
    """The dict ``tools/test.py`` prints last (numpy scalar reprs such as ``np.float32(1.5)``
    are read as numbers; ``test_test_tool_prints_plain_numbers`` checks the format)."""
    line = re.sub(r'np\.(?:float|int)\d*\(([^()]*)\)', r'\1', _metrics_line(out))
    metrics = ast.literal_eval(line)
    assert isinstance(metrics, dict)
    return metrics


def write_config(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def _work_dir(cwd, cfg_path):
    return cwd / 'work_dirs' / osp.splitext(osp.basename(str(cfg_path)))[0]


def _load_tool(name):
    spec = importlib.util.spec_from_file_location(f'_tool_{name}', osp.join(TOOLS, f'{name}.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -------------------------------------------------------------------------- segmentation
SEG_CONFIG = """\
    _base_ = [{base!r}]
    data_root = {data_root!r}
    crop_size = (64, 64)
    norm_cfg = dict(type='BN', requires_grad=True)
    model = dict(
        data_preprocessor=dict(size=crop_size),
        backbone=dict(arch='test', img_size=64, out_indices=(0, 1, 2, 3), drop_path_rate=0.0,
                      init_cfg=None),
        neck=dict(in_channels=32, norm_cfg=norm_cfg),
        decode_head=dict(in_channels=[32] * 4, channels=16, norm_cfg=norm_cfg),
        auxiliary_head=dict(in_channels=32, channels=16, norm_cfg=norm_cfg),
        test_cfg=dict(_delete_=True, mode='whole'))
    train_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', reduce_zero_label=True),
        dict(type='RandomResize', scale=(128, 64), ratio_range=(0.5, 2.0), keep_ratio=True),
        dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackSegInputs'),
    ]
    test_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=(128, 64), keep_ratio=True),
        dict(type='LoadAnnotations', reduce_zero_label=True),
        dict(type='PackSegInputs'),
    ]
    train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                            dataset=dict(data_root=data_root, pipeline=train_pipeline))
    val_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False,
                          dataset=dict(data_root=data_root, pipeline=test_pipeline))
    test_dataloader = val_dataloader
    train_cfg = dict(max_iters=2, val_interval=2)
    default_hooks = dict(checkpoint=dict(interval=1), logger=dict(interval=1))
    randomness = dict(seed=0)
    """


@pytest.fixture(scope='module')
def seg_run(tmp_path_factory):
    """One tiny segmentation training (2 iterations) shared by the tests of this module."""
    root = tmp_path_factory.mktemp('e2e_seg')
    data_root = make_ade20k(root / 'ade', num_train=4, num_val=2, seed=0)
    cfg = write_config(root / 'vim-test_pyramid_upernet_1xb2-2i_ade20k-64x64.py',
                       SEG_CONFIG.format(base=SEG_BASE, data_root=data_root))
    t0 = time.time()
    _, out = run_tool(['train.py', cfg], cwd=root)
    work = _work_dir(root, cfg)
    return dict(root=root, cfg=cfg, work=work, ckpt=work / 'iter_2.pth', train_out=out,
                train_seconds=time.time() - t0)


def test_seg_train_writes_checkpoints_and_validates(seg_run):
    work, out = seg_run['work'], seg_run['train_out']
    assert (work / 'iter_1.pth').is_file() and seg_run['ckpt'].is_file()
    assert osp.samefile((work / 'last_checkpoint').read_text().strip(), seg_run['ckpt'])
    ck = torch.load(seg_run['ckpt'], map_location='cpu', weights_only=False)
    assert ck['meta']['iter'] == 2
    assert any(k.startswith('backbone.layers.3.mixer.') for k in ck['state_dict'])
    assert ck['state_dict']['backbone.pos_embed'].shape[-1] == 32
    # validation ran at iteration 2 through mmseg's IoUMetric
    assert re.search(r'mIoU', out), out[-3000:]


def test_seg_resume_then_test(seg_run):
    root, cfg, work = seg_run['root'], seg_run['cfg'], seg_run['work']
    before = {p: os.stat(work / p).st_mtime_ns for p in ('iter_1.pth', 'iter_2.pth')}
    _, out = run_tool(['train.py', cfg, '--resume', '--cfg-options', 'train_cfg.max_iters=3'],
                      cwd=root)
    assert 'resumed' in out and 'iter: 2' in out, out[-3000:]
    ck3 = work / 'iter_3.pth'
    assert ck3.is_file()
    assert torch.load(ck3, map_location='cpu', weights_only=False)['meta']['iter'] == 3
    # continued from iteration 2: the earlier checkpoints were not written again
    assert {p: os.stat(work / p).st_mtime_ns for p in before} == before
    assert not (work / 'iter_4.pth').exists()

    _, out = run_tool(['test.py', cfg, ck3], cwd=root)
    metrics = printed_metrics(out)
    assert 'mIoU' in metrics and 0.0 <= metrics['mIoU'] <= 100.0, metrics


def test_seg_test_with_token_reduction(seg_run):
    _, out = run_tool(['test.py', seg_run['cfg'], seg_run['ckpt'], '--reduce', 'tome',
                       '--ratio', '0.17'], cwd=seg_run['root'])
    assert "--reduce tome: test with token reduction {'type': 'ToMe', 'ratio': 0.17}" in out, \
        out[-3000:]
    metrics = printed_metrics(out)
    assert 'mIoU' in metrics and 0.0 <= metrics['mIoU'] <= 100.0, metrics


def test_test_tool_prints_plain_numbers(seg_run, monkeypatch, capsys):
    """The printed dict is plain Python (``ast.literal_eval``-able), rounded to 4 digits."""
    monkeypatch.chdir(seg_run['root'])
    monkeypatch.setattr(sys, 'argv', ['test.py', str(seg_run['cfg']), str(seg_run['ckpt']),
                                      '--cfg-options', 'log_level=WARNING'])
    _load_tool('test').main()
    line = _metrics_line(capsys.readouterr().out)
    metrics = ast.literal_eval(line)
    assert 'mIoU' in metrics
    for v in metrics.values():
        assert type(v) in (int, float) and round(v, 4) == v, line


def test_test_tool_refuses_half_given_reduction(seg_run):
    rc, out = run_tool(['test.py', seg_run['cfg'], seg_run['ckpt'], '--reduce', 'tome'],
                       cwd=seg_run['root'], check=False)
    assert rc != 0 and '--reduce and --ratio go together' in out
    assert 'Traceback' not in out


# ------------------------------------------------------------------------------ prune_eval
RESULT_FIELDS = {'model', 'method', 'ratio', 'realised_ratio', 'gflops', 'metric', 'drop',
                 'metric_name', 'seconds'}


@pytest.fixture(scope='module')
def prune_models(seg_run):
    """Two models from the one checkpoint: the trained Vim config and its AMVim variant."""
    cfg_a = seg_run['cfg']
    cfg_b = write_config(seg_run['root'] / 'amvim-test_pyramid_upernet_1xb2-2i_ade20k-64x64.py',
                         f"""\
                         _base_ = [{str(cfg_a)!r}]
                         model = dict(backbone=dict(type='AMVim'))
                         """)
    ckpt = str(seg_run['ckpt'])
    return [str(cfg_a), ckpt, str(cfg_b), ckpt]


def _table_rows(out):
    """The markdown table of prune_eval (the training logs print other '|' tables)."""
    all_lines = out.splitlines()
    starts = [i for i, ln in enumerate(all_lines) if ln.startswith('| model | method |')]
    assert starts, out[-3000:]
    lines = []
    for ln in all_lines[starts[-1]:]:
        if not ln.startswith('|'):
            break
        lines.append(ln)
    assert len(lines) >= 2, out[-3000:]
    header = [c.strip() for c in lines[0].strip('|').split('|')]
    assert set(lines[1].replace('|', '').replace('-', '').strip()) == set()
    rows = [[c.strip() for c in ln.strip('|').split('|')] for ln in lines[2:]]
    return header, [dict(zip(header, r, strict=True)) for r in rows]


def test_prune_eval_sweep_resumes(seg_run, prune_models, tmp_path):
    out_dir = tmp_path / 'pe'
    common = ['--methods', 'tome', 'random', '--out-dir', out_dir, '--names', 'a', 'b']

    # 1) an "interrupted" sweep: only ratio 0
    _, out = run_tool(['prune_eval.py', *prune_models, *common, '--ratios', '0'],
                      cwd=seg_run['root'])
    first = json.loads((out_dir / 'results.json').read_text())
    assert len(first['results']) == 4                 # 2 models x 2 methods x 1 ratio
    zero = {(r['model'], r['method']): r for r in first['results']}

    # 2) the full command: ratio 0 is taken from results.json, only 0.3 runs
    _, out = run_tool(['prune_eval.py', *prune_models, *common, '--ratios', '0', '0.3'],
                      cwd=seg_run['root'])
    header, rows = _table_rows(out)
    assert header[:8] == ['model', 'method', 'ratio', 'realised', 'GFLOPs', 'metric', 'value',
                          'drop']
    assert len(rows) == 8                              # 2 models x 2 methods x 2 ratios
    assert {(r['model'], r['method'], r['ratio']) for r in rows} == {
        (m, k, r) for m in 'ab' for k in ('tome', 'random') for r in ('0.00', '0.30')}
    assert all(r['metric'] == 'mIoU' for r in rows)

    data = json.loads((out_dir / 'results.json').read_text())
    res = data['results']
    assert len(res) == 8
    for r in res:
        assert RESULT_FIELDS <= set(r), sorted(r)
        assert r['metric_name'] == 'mIoU' and 0.0 <= r['metric'] <= 100.0
        assert r['gflops'] > 0
        if r['ratio'] == 0:
            assert r['realised_ratio'] == 0 and r['drop'] == 0
        else:
            assert 0 < r['realised_ratio'] < 1
            assert r['drop'] == pytest.approx(
                r['metric'] - next(z['metric'] for z in res if z['ratio'] == 0
                                   and (z['model'], z['method']) == (r['model'], r['method'])),
                abs=1e-3)
    by = {(r['model'], r['method'], r['ratio']): r for r in res}
    for m in 'ab':
        for k in ('tome', 'random'):
            assert by[(m, k, 0.3)]['gflops'] < by[(m, k, 0)]['gflops']
            # the ratio-0 results of the first run were kept, not recomputed
            old = zero[(m, k)]
            new = by[(m, k, 0)]
            assert {f: new[f] for f in old if f != 'drop'} == \
                {f: old[f] for f in old if f != 'drop'}
    assert data['meta']['convention'] and data['meta']['device'] == 'cpu'

    png = out_dir / 'prune_eval.png'
    assert png.is_file() and png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert str(out_dir / 'results.json') in out and str(png) in out


@pytest.fixture(scope='module')
def prune_eval_tool():
    return _load_tool('prune_eval')


@pytest.mark.parametrize('bad,expect', [
    (['--ratios', '0', '1.2'], 'ratio 1.2 is outside [0, 1)'),
    (['--ratios', '-0.1'], 'ratio -0.1 is outside [0, 1)'),
    (['--methods', 'tome', 'evit_unknown'], "invalid choice: 'evit_unknown'"),
    (['--names', 'a'], '1 names for 2 models'),
    # issue 52: one replicate printed a 95 % interval of width 0
    (['--replicates', '1'], '--replicates must be at least 40'),
])
def test_prune_eval_bad_input(bad, expect, prune_models, prune_eval_tool, tmp_path, capsys):
    args = [*prune_models, '--out-dir', str(tmp_path / 'pe'), *bad]
    if '--names' not in bad:
        args += ['--names', 'a', 'b']
    try:
        rc = prune_eval_tool.main(args)
    except SystemExit as e:           # argparse errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc not in (0, None)
    assert expect in err, err
    assert 'Traceback' not in err
    assert not (tmp_path / 'pe' / 'results.json').exists()


def test_prune_eval_bad_pairs_and_files(prune_models, prune_eval_tool, tmp_path, capsys):
    for args, expect in [
        (prune_models[:3], 'expected CONFIG CHECKPOINT pairs'),
        ([prune_models[0], str(tmp_path / 'missing.pth')], 'checkpoint not found'),
        ([str(tmp_path / 'missing.py'), prune_models[1]], 'config file not found'),
    ]:
        try:
            rc = prune_eval_tool.main([*args, '--out-dir', str(tmp_path / 'pe')])
        except SystemExit as e:
            rc = e.code
        err = capsys.readouterr().err
        assert rc not in (0, None) and expect in err, (args, err)


@pytest.mark.parametrize('content', [
    pytest.param('[]', id='list'),
    pytest.param('{"meta": {}}', id='no-results'),
    pytest.param('{not json', id='not-json'),
])
def test_prune_eval_corrupted_results(content, prune_models, prune_eval_tool, tmp_path, capsys):
    out_dir = tmp_path / 'pe'
    out_dir.mkdir()
    (out_dir / 'results.json').write_text(content)
    rc = prune_eval_tool.main([*prune_models, '--out-dir', str(out_dir), '--names', 'a', 'b',
                               '--ratios', '0'])
    err = capsys.readouterr().err
    assert rc != 0
    assert 'results.json' in err, err          # names the file that is wrong
    assert 'Traceback' not in err
    assert (out_dir / 'results.json').read_text() == content   # left for the user to inspect


# ----------------------------------------------------------------------------- detection
DET_CONFIG = """\
    _base_ = [{base!r}]
    data_root = {data_root!r}
    image_size = (128, 128)
    model = dict(
        data_preprocessor=dict(
            batch_augments=[dict(type='BatchFixedSizePad', size=image_size, pad_mask=True)]),
        backbone=dict(arch='test', img_size=128, out_indices=(3, ), drop_path_rate=0.0,
                      init_cfg=None),
        neck=dict(in_channels=32),
        # an untrained 80-class head scores below the default 0.05: keep every detection so
        # that CocoMetric has results to evaluate (it returns no metrics for an empty result set)
        test_cfg=dict(rcnn=dict(score_thr=0.0, max_per_img=20)))
    train_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
        dict(type='RandomFlip', prob=0.5),
        dict(type='RandomResize', scale=image_size, ratio_range=(0.8, 1.25), keep_ratio=True),
        dict(type='RandomCrop', crop_type='absolute_range', crop_size=image_size,
             recompute_bbox=True, allow_negative_crop=True),
        dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
        dict(type='PackDetInputs'),
    ]
    test_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=image_size, keep_ratio=True),
        dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
        dict(type='PackDetInputs',
             meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
    ]
    train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                            dataset=dict(data_root=data_root, pipeline=train_pipeline))
    val_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                          dataset=dict(data_root=data_root, pipeline=test_pipeline))
    test_dataloader = val_dataloader
    val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json',
                         metric=['bbox', 'segm'])
    test_evaluator = val_evaluator
    # _delete_: the shipped base leaves its own `_delete_=True` in train_cfg, which a plain
    # dict(max_iters=2) would keep (see test_configs.py::test_no_leftover_delete_keys)
    train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=2, val_interval=2)
    default_hooks = dict(checkpoint=dict(interval=2), logger=dict(interval=1))
    randomness = dict(seed=0)
    """

# no validation during these 2-iteration trainings: tools/test.py evaluates right after
NO_VAL = ['--cfg-options', 'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None']


def test_det_train_and_test(tmp_path):
    data_root = make_coco(tmp_path / 'coco', num_images=4, size=(128, 128), seed=0)
    cfg = write_config(tmp_path / 'vim-test_sfp_mask-rcnn_1xb2-2i_coco-128x128.py',
                       DET_CONFIG.format(base=DET_BASE, data_root=data_root + '/'))
    run_tool(['train.py', cfg, *NO_VAL], cwd=tmp_path)
    ckpt = _work_dir(tmp_path, cfg) / 'iter_2.pth'
    assert ckpt.is_file()
    _, out = run_tool(['test.py', cfg, ckpt], cwd=tmp_path)
    metrics = printed_metrics(out)
    for key in ('coco/bbox_mAP', 'coco/segm_mAP'):
        assert key in metrics, metrics
        assert -1.0 <= metrics[key] <= 1.0        # (-1 when nothing is detected)


# ------------------------------------------------------------------------ classification
CLS_CONFIG = """\
    _base_ = [{base!r}]
    data_root = {data_root!r}
    classes = {classes!r}
    data_preprocessor = dict(num_classes={num_classes})
    model = dict(
        backbone=dict(arch='test', img_size=64, init_cfg=None),
        head=dict(num_classes={num_classes}, in_channels=32))
    train_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='RandomResizedCrop', scale=64, backend='pillow', interpolation='bicubic'),
        dict(type='RandomFlip', prob=0.5, direction='horizontal'),
        dict(type='PackInputs'),
    ]
    test_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='ResizeEdge', scale=73, edge='short', backend='pillow',
             interpolation='bicubic'),
        dict(type='CenterCrop', crop_size=64),
        dict(type='PackInputs'),
    ]
    train_dataloader = dict(
        batch_size=3, num_workers=0, persistent_workers=False,
        dataset=dict(_delete_=True, type='CustomDataset', data_root=data_root,
                     ann_file='meta/train.txt', data_prefix='train', classes=classes,
                     pipeline=train_pipeline))
    val_dataloader = dict(
        batch_size=3, num_workers=0, persistent_workers=False,
        dataset=dict(_delete_=True, type='CustomDataset', data_root=data_root,
                     ann_file='meta/val.txt', data_prefix='val', classes=classes,
                     pipeline=test_pipeline))
    test_dataloader = val_dataloader
    val_evaluator = dict(type='Accuracy', topk=(1, ))
    test_evaluator = val_evaluator
    train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=1)
    default_hooks = dict(logger=dict(interval=1))
    randomness = dict(seed=0)
    """
NUM_CLASSES = 3


@pytest.fixture(scope='module')
def cls_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp('e2e_cls')
    data_root = make_imagenet(root / 'imagenet', num_classes=NUM_CLASSES, per_class=2, seed=0)
    classes = sorted(os.listdir(osp.join(data_root, 'train')))
    assert len(classes) == NUM_CLASSES
    cfg = write_config(root / 'vim-test_linear_1xb3-1e_in1k-64.py',
                       CLS_CONFIG.format(base=CLS_BASE, data_root=data_root, classes=classes,
                                         num_classes=NUM_CLASSES))
    return dict(root=root, cfg=cfg, data_root=data_root)


def test_cls_train_and_test(cls_setup):
    root, cfg = cls_setup['root'], cls_setup['cfg']
    _, out = run_tool(['train.py', cfg, *NO_VAL], cwd=root)
    # 6 images, batch 3, 1 epoch: 2 iterations (Mixup/CutMix with 3 classes)
    ckpt = _work_dir(root, cfg) / 'epoch_1.pth'
    assert ckpt.is_file()
    ck = torch.load(ckpt, map_location='cpu', weights_only=False)
    assert ck['meta']['iter'] == 2
    assert ck['state_dict']['head.fc.weight'].shape == (NUM_CLASSES, 32)
    _, out = run_tool(['test.py', cfg, ckpt], cwd=root)
    metrics = printed_metrics(out)
    assert 'accuracy/top1' in metrics and 0.0 <= metrics['accuracy/top1'] <= 100.0, metrics


def test_cls_test_official_vim_file(cls_setup, tmp_path):
    """An official Vim classifier file (``{'model': {...backbone keys, head.weight/bias}}``),
    made at 224 like the released ones (the position embedding is resized to the config's 64)."""
    from amvim_mm.models.backbones import Vim
    torch.manual_seed(0)
    backbone = Vim(arch='test', img_size=224, out_type='cls_token')
    sd = {k: v.clone() for k, v in backbone.state_dict().items()}
    assert not any(k.startswith('backbone.') for k in sd)
    assert sd['pos_embed'].shape == (1, 14 * 14 + 1, 32)
    # a head that always answers the last class: top-1 is then exactly the share of that class
    sd['head.weight'] = torch.zeros(NUM_CLASSES, 32)
    sd['head.bias'] = torch.tensor([0.0] * (NUM_CLASSES - 1) + [50.0])
    official = tmp_path / 'vim_test_midclstok_official.pth'
    torch.save({'model': sd}, official)

    _, out = run_tool(['test.py', cls_setup['cfg'], official], cwd=tmp_path)
    metrics = printed_metrics(out)
    labels = [int(ln.split()[1]) for ln in
              open(osp.join(cls_setup['data_root'], 'meta', 'val.txt')).read().split('\n') if ln]
    expected = 100.0 * labels.count(NUM_CLASSES - 1) / len(labels)
    assert metrics['accuracy/top1'] == pytest.approx(expected, abs=1e-3), metrics


def test_cls_test_official_file_with_wrong_arch_is_refused(cls_setup, tmp_path):
    """Strict loading: an official file of another width is an error naming the keys."""
    from amvim_mm.models.backbones import Vim
    sd = dict(Vim(arch=dict(embed_dims=48, num_layers=4, d_state=8), img_size=64).state_dict())
    sd['head.weight'] = torch.zeros(NUM_CLASSES, 48)
    sd['head.bias'] = torch.zeros(NUM_CLASSES)
    official = tmp_path / 'vim_wrong_official.pth'
    torch.save({'model': sd}, official)
    rc, out = run_tool(['test.py', cls_setup['cfg'], official], cwd=tmp_path, check=False)
    assert rc != 0
    assert 'size mismatch' in out or 'mismatch' in out.lower(), out[-3000:]


# ---------------------------------------------------------------------------------- demo
def test_demo_quick(tmp_path):
    """The main job end to end, shortened: three tasks, Vim and AMVim (and PlainMamba and the
    Segmenter head on Vim's kept tokens for segmentation) in one table per task, one seed
    each."""
    out_dir = tmp_path / 'demo'
    _, out = run_tool(['demo.py', '--quick', '--jobs', '2', '--out-dir', out_dir], cwd=tmp_path,
                      timeout=1200)
    assert '1/4 environment check' in out and '4/4 training-free token reduction' in out
    metrics = {'segmentation': 'mIoU', 'detection': 'coco/bbox_mAP',
               'classification': 'accuracy/top1'}
    models = {'segmentation': ('vim-demo', 'amvim-demo', 'plainmamba-demo',
                               'vim-demo-segmenter'),
              'detection': ('vim-demo-det', 'amvim-demo-det'),
              'classification': ('vim-demo-cls', 'amvim-demo-cls')}
    for task, metric in metrics.items():
        data = json.loads((out_dir / task / 'results.json').read_text())
        names = {f'{m}-s0' for m in models[task]}
        assert {(r['model'], r['method'], r['ratio']) for r in data['results']} == {
            (n, 'tome', r) for n in names for r in (0.0, 0.46)}
        assert all(r['metric_name'] == metric for r in data['results'])
        assert all(r['ci_low'] is not None for r in data['results'])
        groups = {(g['group'], g['ratio']) for g in data['group_results']}
        assert groups == {(m, r) for m in models[task] for r in (0.0, 0.46)}
        assert (out_dir / task / 'prune_eval.png').read_bytes()[:4] == b'\x89PNG'
        # one seed per architecture: prune_eval's own summary says there is no verdict
        assert 'Verdicts: no architecture verdicts' in (out_dir / task / 'summary.md').read_text()
        assert not (out_dir / task / 'prune_eval_forest.png').exists()
        for m in models[task]:
            assert (out_dir / f'{m}-seed0_quick.pth').is_file()
    summary = (out_dir / 'summary.md').read_text()
    for task in metrics:
        assert f'## {task}' in summary
    assert summary.count('| group | models | method |') == 3
    # one table per task; segmentation has each architecture's column and drop difference
    assert '| plainmamba-demo mIoU [95% CI] |' in summary
    assert 'plainmamba-demo - vim-demo drop [CI] verdict' in summary
    assert 'vim-demo-segmenter - vim-demo drop [CI] verdict' in summary
    # each task says what its verdicts rest on (one Holm family, or none with one seed)
    assert summary.count('Verdicts: ') == 3
    assert 'demo finished' in out


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason='checks the message on a machine without CUDA')
def test_benchmark_gpu_suite_without_cuda_says_so(tmp_path):
    rc, out = run_tool(['benchmark.py', '--suite', 'gpu', '--parts', 'reduction',
                        '--reduction-variants', 'default', 'torch-match', '--out-dir', tmp_path],
                       tmp_path, check=False, timeout=300)
    assert rc == 2 and 'error: --suite gpu needs a CUDA device' in out
    rc, out = run_tool(['benchmark.py', '--suite', 'gpu', '--parts', 'speed'], tmp_path,
                       check=False, timeout=300)
    assert rc == 2 and "invalid choice: 'speed'" in out
