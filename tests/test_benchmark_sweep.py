"""The sweep benchmark's plumbing on the CPU (no timing is asserted: speed is measured on the
GPU by ``tools/benchmark_sweep.py``): the synthetic ADE20K-layout set, the random checkpoint,
both modes of the real sweep with the same metrics, every stage of the breakdown."""
import json
import os.path as osp

from amvim_mm.bench.sweep import breakdown, make_ade_like, random_checkpoint, time_modes

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'configs/demo/vim-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py')


def test_sweep_benchmark_on_a_tiny_set(tmp_path):
    import cv2
    sizes = make_ade_like(str(tmp_path / 'mixed'), num=2, sizes=((64, 64), (48, 80)), classes=4)
    img = cv2.imread(osp.join(sizes, 'images/validation/ADE_val_00000002.jpg'))
    ann = cv2.imread(osp.join(sizes, 'annotations/validation/ADE_val_00000002.png'),
                     cv2.IMREAD_UNCHANGED)
    assert img.shape == (48, 80, 3) and ann.shape == (48, 80) and ann.max() <= 4
    # the demo config batches 8 images without a resize: one size
    root = make_ade_like(str(tmp_path / 'ade'), num=6, sizes=((64, 64), ), classes=4)
    ckpt = random_checkpoint(DEMO, str(tmp_path / 'init.pth'))
    modes = time_modes(DEMO, ckpt, root, str(tmp_path / 'w'), methods=('tome', 'random'),
                       ratios=(0, 0.27), seeds=(0, 1), warmup=2)
    assert osp.isfile(str(tmp_path / 'w' / 'warmup' / 'results.json'))
    with open(tmp_path / 'w' / 'warmup' / 'results.json') as f:
        assert {r['images'] for r in json.load(f)['results']} == {2}
    assert modes['same_metrics'] and modes['pass']['rows'] == modes['cell']['rows'] == 4
    assert modes['pass']['evaluations'] == 1 + 1 + 2 and modes['pass']['cells'] == 2
    parts = breakdown(DEMO, ckpt, root, num_batches=1)
    assert set(parts) == {'none', 'ToMe 0.46'}
    for stages in parts.values():
        assert {'loading', 'preprocess', 'inference', 'backbone', 'postprocess_mmseg',
                'postprocess_label_map'} <= set(stages)
        assert all(v >= 0 for k, v in stages.items() if k != 'unit')
