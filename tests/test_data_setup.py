"""A newcomer's first data: ``tools/demo.py --data-only`` generates the demo configs' data and
exits; ``tools/train.py`` / ``tools/test.py`` on a config whose data root is missing end with
one line naming the root, its config key and (for the demo's toy shapes) the command that
generates it, before the runner builds."""
import json
import os.path as osp

import pytest
from mmengine.config import Config

from amvim_mm.apis.cli import run_cli
from amvim_mm.apis.runner import check_data_roots, dataset_roots, load_config, train_loaders
from tests.test_tools_e2e import _load_tool

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SEG = osp.join(ROOT, 'configs/demo/vim-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py')
CLS = osp.join(ROOT, 'configs/demo/vim-demo_linear_1xb8-2k_toyshapes-64x64.py')


def _one_error_line(capsys, rc):
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith('error: '), err
    return err[0]


def test_demo_data_only_generates_the_data_the_demo_configs_read(tmp_path, monkeypatch, capsys):
    """``--data-only`` writes the three sets where the demo configs look (``data/...`` of the
    repository root, here a temporary one, with fewer images) and nothing else; then the
    tools' data check passes for each task's config."""
    monkeypatch.chdir(tmp_path)          # the tool changes directory; restored afterwards
    demo = _load_tool('demo')
    monkeypatch.setattr(demo, 'ROOT', str(tmp_path))
    for task, (root, maker, _, metric, models) in list(demo.TASKS.items()):   # small sets
        monkeypatch.setitem(demo.TASKS, task, (root, maker, dict(num_train=8, num_val=4),
                                               metric, models))
    assert demo.main(['--data-only']) == 0
    printed = capsys.readouterr().out
    assert 'environment check' not in printed and 'checkpoints' not in printed, printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ['data']   # nothing trained or run
    for task, (root, _, sizes, _, models) in demo.TASKS.items():
        manifest = json.loads((tmp_path / root / 'manifest.json').read_text())
        assert manifest['num_train'] == sizes['num_train'], task
        cfg = load_config(osp.join(ROOT, models[0][1]))
        check_data_roots(cfg, train_loaders(cfg) + ('test_dataloader', ), models[0][1])


def test_test_tool_names_the_missing_demo_data(tmp_path, monkeypatch, capsys):
    """A demo config before the demo has run (no ``data/toy_shapes`` in the working folder)."""
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / 'model.pth'
    ckpt.write_bytes(b'')               # the data check comes before the weights are read
    rc = run_cli(lambda: _load_tool('test').main([SEG, str(ckpt)]))
    line = _one_error_line(capsys, rc)
    assert 'data root not found: data/toy_shapes (test_dataloader.dataset.data_root' in line
    assert '`python tools/demo.py --data-only`' in line
    assert not (tmp_path / 'work_dirs').exists()            # no runner was built


def test_train_tool_names_the_key_of_a_missing_data_root(tmp_path, capsys):
    missing = str(tmp_path / 'nowhere')
    rc = run_cli(lambda: _load_tool('train').main(
        [CLS, '--work-dir', str(tmp_path / 'w'),
         '--cfg-options', f'train_dataloader.dataset.data_root={missing}']))
    line = _one_error_line(capsys, rc)
    assert f'data root not found: {missing} (train_dataloader.dataset.data_root of {CLS})' \
        in line
    assert 'demo.py' not in line and '--cfg-options train_dataloader.dataset.data_root=' in line
    assert not (tmp_path / 'w').exists()


def test_data_roots_through_dataset_wrappers(tmp_path):
    cfg = Config(dict(
        train_dataloader=dict(dataset=dict(type='ConcatDataset', datasets=[
            dict(type='A', data_root=str(tmp_path)),
            dict(type='RepeatDataset', times=2, dataset=dict(type='B', data_root='data/x'))])),
        val_dataloader=dict(dataset=dict(type='C', data_root='s3://bucket/val')),
        val_cfg=dict(), val_evaluator=dict(type='M'),
        test_dataloader=None))
    assert dataset_roots(cfg, train_loaders(cfg) + ('test_dataloader', )) == [
        ('train_dataloader.dataset.datasets.0.data_root', str(tmp_path)),
        ('train_dataloader.dataset.datasets.1.dataset.data_root', 'data/x'),
        ('val_dataloader.dataset.data_root', 's3://bucket/val')]
    check_data_roots(cfg, ('val_dataloader', ))              # a URL is not checked
    with pytest.raises(FileNotFoundError, match=r'data/x \(train_dataloader\.dataset\.'
                                                r'datasets\.1\.dataset\.data_root\)'):
        check_data_roots(cfg, train_loaders(cfg))
    cfg.val_cfg = None
    assert train_loaders(cfg) == ('train_dataloader', )


def test_prune_eval_names_the_missing_demo_data(tmp_path, monkeypatch, capsys):
    """The sweep checks each model's test data root before it evaluates anything."""
    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / 'model.pth'
    ckpt.write_bytes(b'')
    rc = run_cli(lambda: _load_tool('prune_eval').main(
        [SEG, str(ckpt), '--methods', 'tome', '--ratios', '0', '--out-dir', str(tmp_path / 'o')]))
    line = _one_error_line(capsys, rc)
    assert 'data root not found: data/toy_shapes (test_dataloader.dataset.data_root' in line
    assert '`python tools/demo.py --data-only`' in line
