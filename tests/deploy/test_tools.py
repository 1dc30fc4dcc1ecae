"""The deployment tools: ``amvim_mm.deploy.ort`` against an independent numpy reference, and
``tools/deploy/`` export -> check -> benchmark end to end on a tiny segmentor (random weights,
toy data), with their one-line errors."""
import importlib.util
import os
import os.path as osp

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip('onnxruntime')
pytest.importorskip('onnx')

from amvim_mm.apis.cli import run_cli  # noqa: E402
from amvim_mm.deploy.ort import (compare_onnx, max_relative_error, ort_session,  # noqa: E402
                                 run_onnx)
from amvim_mm.errors import ConfigError  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO = osp.join(ROOT, 'configs/demo/vim-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py')


def _tool(name):
    spec = importlib.util.spec_from_file_location(f'deploy_{name}',
                                                  osp.join(ROOT, 'tools', 'deploy', name + '.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 3)

    def forward(self, x):
        return self.lin(x), x.sum(-1)


@pytest.fixture(scope='module')
def two_onnx(tmp_path_factory):
    torch.manual_seed(0)
    model = _Two().eval()
    path = str(tmp_path_factory.mktemp('ort') / 'two.onnx')
    torch.onnx.export(model, (torch.randn(2, 6), ), path, dynamo=False, opset_version=17,
                      input_names=['x'], output_names=['y', 's'],
                      dynamic_axes={'x': {0: 'b'}, 'y': {0: 'b'}, 's': {0: 'b'}})
    return model, path


def test_max_relative_error_definition():
    ref = np.array([[1.0, -4.0], [2.0, 0.5]])
    got = ref + np.array([[0.0, 0.2], [-0.1, 0.0]])
    assert max_relative_error(ref, got) == pytest.approx(0.2 / 4.0)
    assert max_relative_error(np.zeros(3), np.zeros(3)) == 0.0
    assert max_relative_error(np.zeros(3), np.ones(3)) == float('inf')
    with pytest.raises(ConfigError, match='shapes differ'):
        max_relative_error(np.zeros(3), np.zeros(4))
    # issue 52: NaN (e.g. from NaN initializers) vanished in Python's max and printed "OK 0"
    assert max_relative_error(ref, np.where(ref > 1, np.nan, ref)) == float('inf')
    assert max(0.0, max_relative_error(ref, ref * np.inf)) == float('inf')


def test_check_onnx_refuses_to_compare_nothing(capsys):
    """Issue 52: ``--random 0 --real 0`` printed OK having compared nothing."""
    for argv, message in ((['--random', '0', '--real', '0'], 'compare nothing'),
                          (['--random', '-1'], '--random takes a count'),
                          (['--tol', 'nan'], '--tol takes a finite number'),
                          (['--threads', '-1'], 'expected a positive integer')):
        with pytest.raises(SystemExit) as exit_:
            _tool('check_onnx').parse_args(['cfg.py', 'ckpt.pth', 'x.onnx', *argv])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_run_and_compare_against_numpy(two_onnx):
    model, path = two_onnx
    session = ort_session(path, threads=1)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    y, s = run_onnx(session, x)          # a dynamic batch of 5
    w, b = model.lin.weight.detach().numpy(), model.lin.bias.detach().numpy()
    np.testing.assert_allclose(y, x.numpy() @ w.T + b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s, x.numpy().sum(-1), rtol=1e-5, atol=1e-6)
    result = compare_onnx(model, path, x, session=session)
    assert list(result) == ['y', 's']
    assert result['y']['shape'] == (5, 3) and result['s']['shape'] == (5, )
    assert max(r['max_rel_err'] for r in result.values()) < 1e-5
    with torch.no_grad():   # a changed model is caught
        model.lin.bias += 1
    try:
        assert compare_onnx(model, path, x, session=session)['y']['max_rel_err'] > 0.05
    finally:
        with torch.no_grad():
            model.lin.bias -= 1


def test_ort_errors(two_onnx, tmp_path):
    _, path = two_onnx
    with pytest.raises(FileNotFoundError, match='ONNX file not found'):
        ort_session(str(tmp_path / 'missing.onnx'))
    bad = tmp_path / 'bad.onnx'
    bad.write_bytes(b'not a model')
    with pytest.raises(ConfigError, match='ONNX Runtime cannot load') as err:
        ort_session(str(bad))
    assert '\n' not in str(err.value)
    session = ort_session(path)
    with pytest.raises(ConfigError, match='has shape'):
        run_onnx(session, np.zeros((2, 5), np.float32))
    with pytest.raises(ConfigError, match='takes 1 input'):
        run_onnx(session, np.zeros((2, 6), np.float32), np.zeros(1))


@pytest.fixture(scope='module')
def tiny_segmentor(tmp_path_factory):
    """A tiny Vim UperNet config (the demo's, 2 blocks of width 32) on 4 toy images, and a
    checkpoint of its random weights."""
    from amvim_mm.datasets.toy_shapes import make_toy_shapes
    from amvim_mm.deploy.tasks import load_task_model  # noqa: F401  (registers the scopes)
    tmp = tmp_path_factory.mktemp('seg')
    data = make_toy_shapes(str(tmp / 'toy'), num_train=1, num_val=4)
    cfg_path = tmp / 'tiny.py'
    cfg_path.write_text(
        f"_base_ = ['{DEMO}']\n"
        "model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=4, d_state=4),\n"
        "                           out_indices=(0, 1, 2, 3)),\n"
        "             neck=dict(in_channels=32), decode_head=dict(in_channels=[32] * 4,\n"
        "                                                       channels=16))\n"
        f"test_dataloader = dict(batch_size=2, dataset=dict(data_root='{data}'))\n")
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    cfg = Config.fromfile(str(cfg_path))
    init_default_scope('mmseg')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    ckpt = str(tmp / 'tiny.pth')
    torch.save({'state_dict': model.state_dict()}, ckpt)
    return str(cfg_path), ckpt, tmp


def _run(tool, argv, capsys):
    code = run_cli(lambda: _tool(tool).main([str(a) for a in argv]))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_export_check_benchmark(tiny_segmentor, capsys):
    cfg, ckpt, tmp = tiny_segmentor
    onnx_path = tmp / 'seg.onnx'
    code, out, err = _run('export_onnx', [cfg, ckpt, '--out', onnx_path], capsys)
    assert code == 0, err
    assert 'input batchx3x64x64' in out and 'seg_logits' in out
    session = ort_session(str(onnx_path))
    assert [o.name for o in session.get_outputs()] == ['seg_logits']
    code, out, err = _run('check_onnx', [cfg, ckpt, onnx_path, '--random', 2, '--real', 'all',
                                         '--batch', 2], capsys)
    assert code == 0, out + err
    assert 'random (2 images)' in out and 'real (4 images)' in out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if 'metric on those' in ln}
    mious = {k: float(v.split('mIoU ')[1].split(',')[0]) for k, v in lines.items()}
    assert mious['onnxruntime'] == pytest.approx(mious['pytorch'], abs=0.01)
    assert out.splitlines()[-1].startswith('OK: largest relative error')
    code, out, err = _run('benchmark_onnx', [cfg, ckpt, onnx_path, '--batch', 1, 2,
                                             '--rounds', 1, '--iters', 1, '--threads', 1], capsys)
    assert code == 0, err
    rows = [ln for ln in out.splitlines() if ln.startswith('| 1 |') or ln.startswith('| 2 |')]
    assert len(rows) == 2


def test_static_deploy_config_and_errors(tiny_segmentor, capsys):
    cfg, ckpt, tmp = tiny_segmentor
    static = osp.join(ROOT, 'configs/deploy/segmentation_onnxruntime_static-64x64.py')
    onnx_path = tmp / 'static.onnx'
    code, out, err = _run('export_onnx', [cfg, ckpt, '--deploy-cfg', static, '--out',
                                          onnx_path], capsys)
    assert code == 0, err
    assert 'input 1x3x64x64' in out
    code, _, err = _run('benchmark_onnx', [cfg, ckpt, onnx_path, '--batch', 8], capsys)
    assert code == 2 and 'fixed batch of 1' in err and len(err.strip().splitlines()) == 1
    code, _, err = _run('export_onnx', [cfg, str(tmp / 'none.pth')], capsys)
    assert code == 2 and 'checkpoint not found' in err
    code, _, err = _run('export_onnx', [cfg, ckpt, '--reduce', 'tome'], capsys)
    assert code == 2 and '--reduce and --ratio go together' in err
    det = osp.join(ROOT, 'configs/deploy/detection_onnxruntime_dynamic.py')
    code, _, err = _run('export_onnx', [cfg, ckpt, '--deploy-cfg', det], capsys)
    assert code == 2 and 'mmdet deploy config' in err
    code, _, err = _run('check_onnx', [cfg, ckpt, tmp / 'missing.onnx'], capsys)
    assert code == 2 and 'ONNX file not found' in err


def test_export_never_overwrites_an_input_or_an_existing_file(tiny_segmentor, capsys):
    """Issue 52, defect 2: ``--out CKPT`` replaced the checkpoint with the ONNX file and
    ``--out CFG`` the config (rc 0). An output that is an input (also through a link) is
    refused in one line before any work; an existing output needs ``--force``."""
    import hashlib
    cfg, ckpt, tmp = tiny_segmentor

    def digest(path):
        return hashlib.sha256(open(path, 'rb').read()).hexdigest()
    before = {p: digest(p) for p in (cfg, ckpt)}
    link = tmp / 'link-to-ckpt.pth'
    if not link.exists():
        os.symlink(ckpt, link)
    for out, what in ((ckpt, 'checkpoint'), (cfg, 'config'), (link, 'checkpoint'),
                      (osp.join(osp.dirname(ckpt), '.', osp.basename(ckpt)), 'checkpoint')):
        code, _, err = _run('export_onnx', [cfg, ckpt, '--out', out, '--force'], capsys)
        assert code == 2 and f'is the {what} given as input' in err, err
        assert len(err.strip().splitlines()) == 1
    assert {p: digest(p) for p in (cfg, ckpt)} == before
    existing = tmp / 'existing.onnx'
    existing.write_bytes(b'a file the user keeps')
    code, _, err = _run('export_onnx', [cfg, ckpt, '--out', existing], capsys)
    assert code == 2 and 'exists; pass --force' in err
    assert existing.read_bytes() == b'a file the user keeps'
    code, out, err = _run('export_onnx', [cfg, ckpt, '--out', existing, '--force'], capsys)
    assert code == 0, err
    assert ort_session(str(existing)).get_outputs()[0].name == 'seg_logits'


def test_missing_extras_hint(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_ort(name, *args, **kwargs):
        if name == 'onnxruntime':
            raise ImportError(name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, '__import__', no_ort)
    with pytest.raises(ConfigError, match='pip install -r requirements/deploy.txt'):
        ort_session('anything.onnx')


@pytest.mark.parametrize('name', sorted(n for n in os.listdir(osp.join(ROOT, 'configs', 'deploy'))
                                          if n.endswith('.py')))
def test_every_shipped_deploy_config_reads(name):
    """Each deploy config of configs/deploy/ reads (onnxruntime backend, onnx type), names its
    task in the file name, and is static or dynamic-batch as its name says."""
    from amvim_mm.deploy.tasks import is_dynamic_batch, load_deploy_config
    cfg = load_deploy_config(osp.join(ROOT, 'configs', 'deploy', name))
    scope = {'segmentation': 'mmseg', 'detection': 'mmdet', 'classification': 'mmpretrain'}
    assert cfg['codebase_config']['type'] == scope[name.split('_')[0]]
    assert cfg['onnx_config']['opset_version'] >= 17
    assert is_dynamic_batch(cfg) == ('_dynamic' in name)


def test_a_fine_tuning_config_deploys_its_student():
    """Issue 52, defect 8: check_onnx on a DynamicViT fine-tuning config ended in
    "'ReducerFineTuner' object has no attribute 'encode_decode'"; the deploy tools now take
    the wrapper's student (the model with its learned reducer, as tools/test.py runs it)."""
    import argparse

    from amvim_mm.deploy.tasks import load_task_model
    from amvim_mm.engine.hooks import find_reducible_backbone
    cfg = osp.join(ROOT, 'configs/demo/vim-demo_pyramid_upernet_1xb8-600i_toyshapes-64x64_'
                         'dynamicvit.py')
    ckpt = osp.join(ROOT, 'checkpoints/demo/vim-demo-dynamicvit-seed0_toyshapes-64x64.pth')
    args = argparse.Namespace(config=cfg, checkpoint=ckpt, cfg_options=None, reduce='learned',
                              ratio=None, seed=None, locations=None)
    _, model = load_task_model(args)
    assert type(model).__name__ == 'EncoderDecoder' and hasattr(model, 'encode_decode')
    reducer = find_reducible_backbone(model).token_reducer
    assert type(reducer).__name__ == 'DynamicViTReducer' and not model.training


def test_an_odd_size_exports_and_a_graph_that_cannot_run_writes_nothing(tmp_path, capsys,
                                                                        monkeypatch):
    """Issue 52, defect 3: a classifier exported at 37x53 exited 0 and ONNX Runtime then
    failed on the file ("Attempting to broadcast an axis..."): the traced ceil division of the
    image size became an integer Div that truncates, so the graph padded wrongly. The sizes are
    constants of the export now and 37x53 runs with parity. A graph that still cannot run in
    ONNX Runtime stops the export in one line and nothing is written; a size the family cannot
    take at all stops before any export work."""
    from amvim_mm.deploy import ort
    cfg = osp.join(ROOT, 'configs/demo/vim-demo_linear_1xb8-2k_toyshapes-64x64.py')
    ckpt = osp.join(ROOT, 'checkpoints/demo/vim-demo-cls-seed0_toyshapes-64x64.pth')
    out = tmp_path / 'cls.onnx'
    code, text, err = _run('export_onnx', [cfg, ckpt, '--shape', 37, 53, '--out', out], capsys)
    assert code == 0 and 'input batchx3x37x53' in text, err
    code, text, err = _run('check_onnx', [cfg, ckpt, out, '--random', 4, '--real', 0], capsys)
    assert code == 0 and 'OK' in text, text + err
    out.unlink()

    def cannot_run(*args, **kwargs):
        raise RuntimeError('[ONNXRuntimeError] : 1 : FAIL : Attempting to broadcast an axis '
                           'by a dimension other than 1.\n(long trace)')
    monkeypatch.setattr(ort, 'run_onnx', cannot_run)
    code, _, err = _run('export_onnx', [cfg, ckpt, '--shape', 37, 53, '--out', out], capsys)
    assert code == 2 and 'does not run in ONNX Runtime at 37x53' in err, err
    assert 'nothing written' in err and len(err.strip().splitlines()) <= 2
    assert not list(tmp_path.iterdir())
    code, _, err = _run('export_onnx', [cfg, ckpt, '--shape', 7, 53, '--out', out], capsys)
    assert code == 2 and 'smaller than one patch' in err and not list(tmp_path.iterdir())


def test_a_reduced_segmentor_exports_and_an_exporter_failure_is_one_line(tmp_path, capfd,
                                                                        monkeypatch):
    """Issue 52, defect 5: the demo Vim UperNet with ToMe 0.46 ended in a 3,000-line trace
    (the exporter's graph dump and "adaptive_avg_pool2d, input size not accessible"). It now
    exports (verified in ONNX Runtime before it is written, its output sizes named); an
    exporter that still fails ends in one line, prints no graph and writes nothing."""
    import torch
    cfg = osp.join(ROOT, 'configs/demo/vim-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py')
    ckpt = osp.join(ROOT, 'checkpoints/demo/vim-demo-seed0_toyshapes-64x64.pth')
    argv = [cfg, ckpt, '--reduce', 'tome', '--ratio', '0.46', '--out', str(tmp_path / 's.onnx')]
    code = run_cli(lambda: _tool('export_onnx').main(argv))
    out, err = capfd.readouterr()
    assert code == 0, err
    assert 'outputs seg_logits batchx5x64x64' in out and (tmp_path / 's.onnx').is_file()

    def failing_export(*args, **kwargs):
        # the TorchScript exporter's graph dump, written by its C++ side to file descriptor 1
        os.write(1, b'graph(%input : Float(1, 3, 64, 64)):\n' * 3000)
        raise RuntimeError('Unsupported: ONNX export of operator foo, input size not '
                           'accessible.  [Caused by the value \'x\' ...]')
    monkeypatch.setattr(torch.onnx, 'export', failing_export)
    argv[-1] = str(tmp_path / 'f.onnx')
    code = run_cli(lambda: _tool('export_onnx').main(argv))
    out, err = capfd.readouterr()
    assert code == 2
    assert 'cannot export this model: Unsupported: ONNX export of operator foo' in err
    assert len(out.splitlines()) < 5 and 'Traceback' not in err and 'graph(' not in out
    assert not (tmp_path / 'f.onnx').exists()
    assert [p.name for p in tmp_path.iterdir()] == ['s.onnx']


def test_check_onnx_scores_a_detector_subset_against_its_own_annotations(tmp_path, capsys):
    """Issue 52, defect 6c: ``--real N`` for a detector scored N images against every image's
    annotations (box AP 0.075 against 0.411). N images must score as a data set of exactly
    those N images does (an annotation file holding only them, scored by the library)."""
    import json

    from amvim_mm.datasets.toy_shapes import make_toy_shapes_coco
    cfg = osp.join(ROOT, 'configs/demo/vim-demo_sfp_retinanet_1xb8-2k_toyshapes-64x64.py')
    ckpt = osp.join(ROOT, 'checkpoints/demo/vim-demo-det-seed0_toyshapes-64x64.pth')
    data = make_toy_shapes_coco(str(tmp_path / 'coco'), num_train=1, num_val=12)
    onnx_path = tmp_path / 'det.onnx'
    code, _, err = _run('export_onnx', [cfg, ckpt, '--out', onnx_path], capsys)
    assert code == 0, err

    def ap(real, ann):
        code, out, err = _run('check_onnx', [
            cfg, ckpt, onnx_path, '--random', 0, '--real', real, '--cfg-options',
            f'test_dataloader.dataset.data_root={data}',
            f'test_dataloader.dataset.ann_file={ann}', f'test_evaluator.ann_file={ann}'],
            capsys)
        assert code == 0, out + err
        line = next(ln for ln in out.splitlines() if ln.startswith('pytorch'))
        return float(line.split('coco/bbox_mAP ')[1].split(',')[0])
    full_ann = osp.join(data, 'annotations/instances_val2017.json')
    subset = ap('5', full_ann)
    full = json.load(open(full_ann))
    keep = {im['id'] for im in full['images'][:5]}
    own = dict(full, images=[im for im in full['images'] if im['id'] in keep],
               annotations=[a for a in full['annotations'] if a['image_id'] in keep])
    ann = tmp_path / 'first5.json'
    ann.write_text(json.dumps(own))
    assert subset == pytest.approx(ap('all', str(ann)), abs=1e-4) and subset > 0


def test_check_onnx_tells_a_near_tie_of_tome_from_a_wrong_graph(tmp_path, capsys):
    """Issue 52, defect 6b: a classifier with ToMe 0.27 through ONNX Runtime differed from
    PyTorch on real images (relative error 1.7, one image in 100 changed class) and check_onnx
    reported FAILED. The graph is right: the images that differ are those whose ToMe choices
    sit at a near tie (flat regions: cosine similarities one fp32 step apart), where two
    runtimes' rounding may choose differently. check_onnx now counts them apart and judges the
    others; a graph that is wrong on images with clear choices still fails."""
    from amvim_mm.datasets.toy_shapes import make_toy_shapes_cls
    cfg = osp.join(ROOT, 'configs/demo/vim-demo_linear_1xb8-2k_toyshapes-64x64.py')
    ckpt = osp.join(ROOT, 'checkpoints/demo/vim-demo-cls-seed0_toyshapes-64x64.pth')
    data = make_toy_shapes_cls(str(tmp_path / 'cls'), num_train=1, num_val=100)
    onnx_path = tmp_path / 'cls.onnx'
    tome = ['--reduce', 'tome', '--ratio', '0.27']
    code, _, err = _run('export_onnx', [cfg, ckpt, '--out', onnx_path] + tome, capsys)
    assert code == 0, err
    real = ['--random', 0, '--real', 'all', '--cfg-options',
            f'test_dataloader.dataset.data_root={data}']
    code, out, err = _run('check_onnx', [cfg, ckpt, onnx_path] + tome + real, capsys)
    assert code == 0, out + err
    main_line = next(ln for ln in out.splitlines() if ln.startswith('real (100 images)'))
    tie_line = next(ln for ln in out.splitlines() if 'at a near tie' in ln)
    assert float(main_line.split('cls_score ')[1].split(';')[0]) <= 1e-4
    assert float(tie_line.split('cls_score ')[1].split(',')[0]) > 1e-2   # choices did differ
    # the same graph checked against another model (ToMe 0.46): clear choices differ -> FAILED
    code, out, _ = _run('check_onnx', [cfg, ckpt, onnx_path, '--reduce', 'tome', '--ratio',
                                       '0.46'] + real, capsys)
    assert code == 1 and 'FAILED' in out


def test_a_size_cache_builds_in_one_command_and_runs_each_size(tmp_path, capsys):
    """Issue 55: ``--sizes`` exports one graph per image size into a folder with its manifest;
    :class:`SizeCache` runs each batch on the graph of its size with the parity of a single
    export; the same command with one more size adds it and keeps the others; a size the
    folder lacks is a one-line error naming the command that adds it."""
    import argparse
    import torch
    from amvim_mm.deploy.size_cache import SizeCache
    from amvim_mm.deploy.tasks import TaskForward, load_task_model
    from amvim_mm.errors import ConfigError
    cfg = osp.join(ROOT, 'configs/demo/vim-demo_linear_1xb8-2k_toyshapes-64x64.py')
    ckpt = osp.join(ROOT, 'checkpoints/demo/vim-demo-cls-seed0_toyshapes-64x64.pth')
    folder = tmp_path / 'cls_sizes'
    code, out, err = _run('export_onnx', [cfg, ckpt, '--sizes', '64x64', '48x80', '--out',
                                          folder], capsys)
    assert code == 0 and 'sizes 48x80, 64x64' in out, err
    assert sorted(p.name for p in folder.iterdir()) == ['48x80.onnx', '64x64.onnx',
                                                        'sizes.json']
    kept = (folder / '64x64.onnx').stat().st_mtime_ns
    code, _, err = _run('export_onnx', [cfg, ckpt, '--sizes', '64x64', '32x48', '--out',
                                        folder], capsys)
    assert code == 0 and '64x64: kept' in err and '32x48: exported' in err, err
    assert (folder / '64x64.onnx').stat().st_mtime_ns == kept
    cache = SizeCache(str(folder))
    assert cache.sizes == [(32, 48), (48, 80), (64, 64)]
    args = argparse.Namespace(config=cfg, checkpoint=ckpt, cfg_options=None, reduce=None,
                              ratio=None, seed=None, locations=None)
    _, model = load_task_model(args)
    for h, w in cache.sizes:
        x = torch.randn(3, 3, h, w, generator=torch.Generator().manual_seed(h))
        with torch.no_grad():
            ref = TaskForward(model, 'mmpretrain', (h, w)).eval()(x)
        ref = ref[0] if isinstance(ref, (tuple, list)) else ref
        got = torch.from_numpy(cache.run(x.numpy())[0])
        assert ((got - ref).abs().max() / ref.abs().max()).item() < 1e-4, (h, w)
    with pytest.raises(ConfigError, match=r'no graph for 56x56 .* \(it has 32x48, 48x80, '
                                          r'64x64\); add it: python tools/deploy/export_onnx'
                                          r'.py .* --sizes 56x56 --out'):
        cache.run(torch.zeros(1, 3, 56, 56).numpy())
    code, _, err = _run('export_onnx', [cfg, ckpt, '--sizes', '64by64', '--out', folder],
                        capsys)
    assert code == 2 and 'an image size is HxW' in err and len(err.strip().splitlines()) == 1
    # another model's options into the same folder: refused, nothing changed
    code, _, err = _run('export_onnx', [cfg, ckpt, '--reduce', 'tome', '--ratio', '0.27',
                                        '--sizes', '64x64', '--out', folder], capsys)
    assert code == 2 and 'holds graphs of another model or export options' in err, err
    assert (folder / '64x64.onnx').stat().st_mtime_ns == kept


def test_benchmark_onnx_times_every_family_next_to_deit(tmp_path, capsys):
    """Issue 55: ``benchmark_onnx.py --models ...`` exports each family's classifier and
    DeiT-T, checks each graph against PyTorch and times ONNX Runtime and PyTorch in one run;
    its ratios are the quotients of its own medians; an unknown model is one line."""
    import json
    out_dir = tmp_path / 'fam'
    code, out, err = _run('benchmark_onnx', ['--models', 'vim-test', 'vil-test', 'deit-t',
                                             '--res', 64, '--rounds', 2, '--iters', 1,
                                             '--threads', 1, '--tome', 0.3, '--out-dir',
                                             out_dir], capsys)
    assert code == 0, err
    rows = json.loads((out_dir / 'onnx_families.json').read_text())['rows']
    assert [(r['model'], r['reduction']) for r in rows] == [
        ('vim-test', 'none'), ('vim-test', 'ToMe 0.3'), ('vil-test', 'none'),
        ('vil-test', 'ToMe 0.3'), ('deit-t', 'none')]
    deit = rows[-1]
    for plain, red in ((rows[0], rows[1]), (rows[2], rows[3])):
        assert red['flops_ratio'] > 1 and red['onnx_nodes'] != plain['onnx_nodes']
        assert red['ort_speedup'] == round(plain['onnxruntime_ms'] / red['onnxruntime_ms'], 3)
    for r in rows:
        assert r['max_rel_err'] < 1e-4 and r['onnx_nodes'] > 0
        assert r['ort_over_pytorch'] == round(r['onnxruntime_ms'] / r['pytorch_ms'], 2)
        assert r['ort_over_deit_ort'] == round(r['onnxruntime_ms'] / deit['onnxruntime_ms'], 2)
    assert '| vil-test |' in out and (out_dir / 'onnx_families.md').is_file()
    code, _, err = _run('benchmark_onnx', ['--models', 'mambaout', '--out-dir', out_dir],
                        capsys)
    assert code == 2 and "unknown model 'mambaout'" in err and len(err.strip().splitlines()) == 1
