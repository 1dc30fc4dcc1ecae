"""ViL and AMViL through the libraries' tools end to end on tiny data: ``tools/train.py`` trains
a ViL UperNet (arch 'test', 2 iterations, ADE20K-format data made here), and
``tools/prune_eval.py`` sweeps ToMe, EViT and ToP over that checkpoint for ViL and AMViL (a ViL
file loads 1:1 into AMViL) in one table."""
import json
import os.path as osp

from tests.test_tools_e2e import (ROOT, SEG_CONFIG, _table_rows, _work_dir, make_ade20k,
                                  run_tool, write_config)

VIL_BASE = osp.join(ROOT, 'configs/vil/vil-t_pyramid_upernet_8xb2-160k_ade20k-512x512.py')


def test_vil_train_then_prune_eval_next_to_amvil(tmp_path):
    data_root = make_ade20k(tmp_path / 'ade', num_train=4, num_val=2, seed=0)
    cfg = write_config(tmp_path / 'vil-test_pyramid_upernet_1xb2-2i_ade20k-64x64.py',
                       SEG_CONFIG.format(base=VIL_BASE, data_root=data_root))
    run_tool(['train.py', cfg], cwd=tmp_path)
    ckpt = _work_dir(tmp_path, cfg) / 'iter_2.pth'
    assert ckpt.is_file()
    cfg_b = write_config(tmp_path / 'amvil-test_pyramid_upernet_1xb2-2i_ade20k-64x64.py',
                         f"_base_ = [{str(cfg)!r}]\nmodel = dict(backbone=dict(type='AMViL'))\n")
    out_dir = tmp_path / 'pe'
    _, out = run_tool(['prune_eval.py', str(cfg), str(ckpt), str(cfg_b), str(ckpt),
                       '--names', 'vil', 'amvil', '--methods', 'tome', 'evit', 'top',
                       '--ratios', '0', '0.3', '--out-dir', out_dir], cwd=tmp_path)
    _, rows = _table_rows(out)
    assert {(r['model'], r['method']) for r in rows} == {
        (m, k) for m in ('vil', 'amvil') for k in ('tome', 'evit', 'top')}
    results = json.loads((out_dir / 'results.json').read_text())['results']
    assert len(results) == 12
    by = {(r['model'], r['method'], r['ratio']): r for r in results}
    for m in ('vil', 'amvil'):
        for k in ('tome', 'evit', 'top'):
            zero, cut = by[(m, k, 0.0)], by[(m, k, 0.3)]
            assert cut['gflops'] < zero['gflops'] and cut['realised_ratio'] > 0.1
            assert 0 <= cut['metric'] <= 100
        # ratio 0 is the unreduced model whatever the method
        assert len({by[(m, k, 0.0)]['metric'] for k in ('tome', 'evit', 'top')}) == 1


def test_demo_families_option_adds_vil_models():
    """``tools/demo.py --families vil amvil`` adds the ViL and AMViL demo models (their configs
    exist) to the segmentation task only; an unknown family is refused by the parser."""
    from tests.test_tools_e2e import _load_tool
    demo = _load_tool('demo')
    seg = demo.task_models('segmentation', ['vil', 'amvil'])
    assert [n for n, _ in seg[-2:]] == ['vil-demo', 'amvil-demo']
    assert all(osp.isfile(osp.join(ROOT, c)) for _, c in seg)
    assert demo.task_models('detection', ['vil']) == demo.task_models('detection')
    rc, out = run_tool(['demo.py', '--families', 'vim'], cwd=ROOT, check=False)
    assert rc == 2 and "invalid choice: 'vim'" in out
