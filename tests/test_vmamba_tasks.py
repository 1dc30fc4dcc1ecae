"""VMamba in the three tasks through the tools: tools/train.py (a few iterations) and
tools/prune_eval.py with every reducer in stage 3, on the built-in toy shapes in the ADE20K,
COCO and ImageNet-folder layouts (the demo's data and recipes, the backbone swapped)."""
import json
import os.path as osp

import pytest

from tests.test_tools_e2e import _work_dir, run_tool, write_config

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'configs', 'demo')
TASKS = {
    # task: (demo config, override of the demo model, data maker, metric)
    'seg': ('vim-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py', """
        model = dict(
            backbone=dict(_delete_=True, type='VMamba', arch='test', img_size=64,
                          out_indices=(0, 1, 2, 3)),
            neck=None,
            decode_head=dict(in_channels=[16, 32, 64, 128], channels=16))
        """, 'make_toy_shapes', 'mIoU'),
    'det': ('vim-demo_sfp_retinanet_1xb8-2k_toyshapes-64x64.py', """
        model = dict(
            backbone=dict(_delete_=True, type='VMamba', arch='test', img_size=64,
                          out_indices=(0, 1, 2)),
            neck=dict(_delete_=True, type='FPN', in_channels=[16, 32, 64], out_channels=32,
                      num_outs=3),
            bbox_head=dict(in_channels=32, feat_channels=32))
        """, 'make_toy_shapes_coco', 'coco/bbox_mAP'),
    'cls': ('vim-demo_linear_1xb8-2k_toyshapes-64x64.py', """
        model = dict(
            backbone=dict(_delete_=True, type='VMamba', arch='test', img_size=64,
                          out_type='avg_featmap', out_indices=(3, )),
            neck=None,
            head=dict(in_channels=128))
        """, 'make_toy_shapes_cls', 'accuracy/top1'),
}


@pytest.fixture(scope='module', params=sorted(TASKS))
def trained(request, tmp_path_factory):
    """A VMamba model of one task trained for 4 iterations with tools/train.py."""
    from amvim_mm import datasets
    task = request.param
    demo, override, maker, metric = TASKS[task]
    root = tmp_path_factory.mktemp(f'vmamba_{task}')
    data = str(root / 'data')
    getattr(datasets, maker)(data, num_train=8, num_val=6)
    cfg = write_config(root / f'vmamba-test_{task}_1xb4-4i_toyshapes-64x64.py', f"""\
        _base_ = [{osp.join(DEMO, demo)!r}]
        {override.strip()}
        train_dataloader = dict(batch_size=4, dataset=dict(data_root={data!r}))
        val_dataloader = dict(batch_size=3, dataset=dict(data_root={data!r}))
        test_dataloader = val_dataloader
        train_cfg = dict(max_iters=4, val_interval=4)
        default_hooks = dict(checkpoint=dict(interval=4), logger=dict(interval=1))
        """ + (f"""
        val_evaluator = dict(ann_file={data + '/annotations/instances_val2017.json'!r})
        test_evaluator = val_evaluator
        """ if task == 'det' else ''))
    run_tool(['train.py', str(cfg), '--cfg-options', 'val_cfg=None', 'val_dataloader=None',
              'val_evaluator=None'], cwd=root, timeout=900)
    ckpt = _work_dir(root, cfg) / 'iter_4.pth'
    assert ckpt.is_file()
    return dict(task=task, root=root, cfg=cfg, ckpt=ckpt, metric=metric)


def test_prune_eval_every_reducer_in_stage_3(trained):
    out = trained['root'] / 'pe'
    _, text = run_tool(['prune_eval.py', trained['cfg'], trained['ckpt'], '--methods', 'tome',
                        'random', 'evit', 'top', '--ratios', '0', '0.4', '--out-dir', out,
                        '--names', 'vmamba-test', '--replicates', '100',
                        '--flops-convention', 'official'], cwd=trained['root'], timeout=900)
    rows = json.loads((out / 'results.json').read_text())['results']
    assert {r['method'] for r in rows} == {'tome', 'random', 'evit', 'top'}
    zero = next(r for r in rows if r['ratio'] == 0)
    assert zero['metric_name'] == trained['metric']
    for r in rows:
        if r['ratio'] == 0:
            assert r['realised_ratio'] == 0 and r['gflops'] == zero['gflops']
            continue
        # stage 3 of the 64 x 64 input: a 4 x 4 grid, 2 blocks
        assert 0.25 <= r['realised_ratio'] <= 0.5, r
        assert r['gflops'] < zero['gflops']
        assert r['gflops_convention'] == 'official'
        assert r['metric'] == r['metric']          # a number, not NaN
    assert '| vmamba-test |' in text
