"""Random pruning draws per image: the tokens an image loses are a function of (seed, image,
block), the same in any batch, order and position, and different across images; the
identities come from the data samples (``ImageIdentityHook``) and, through
``tools/prune_eval.py``, a batch-1 and a batch-8 run give the same per-image results."""
import json
import logging
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch
from mmengine.logging import MMLogger
from mmengine.structures import BaseDataElement

from amvim_mm.analysis import stats as S
from amvim_mm.engine.hooks import image_keys
from amvim_mm.models.backbones import Vim

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _model():
    torch.manual_seed(0)
    m = Vim(arch='test', img_size=32, out_type='cls_token',
            token_reduction=dict(type='RandomPrune', ratio=0.27, seed=3)).eval()
    return m


def _masks(model, x, keys):
    """Per image: the (block, indices in the current sequence) of the tokens it loses."""
    red = model.token_reducer
    red.set_image_keys(keys)
    seen = []
    select = red.select

    def spy(block, k, stream, ctx, layer):
        removed, dst, extra = select(block, k, stream, ctx, layer)
        seen.append((block, removed))
        return removed, dst, extra
    red.select = spy
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        red.select = select
        red.set_image_keys(None)
    per_image = [[(b, tuple(sorted(r[i].tolist()))) for b, r in seen] for i in range(len(x))]
    return out, per_image


def test_masks_do_not_depend_on_the_batch_and_differ_across_images():
    model = _model()
    x = torch.randn(4, 3, 32, 32)
    keys = ['a.png', 'b.png', 'c.png', 'd.png']
    out4, masks4 = _masks(model, x, keys)
    assert len(masks4[0]) > 1                                 # several reduction blocks
    for i in range(4):                                        # alone, batch of one
        out1, masks1 = _masks(model, x[i:i + 1], keys[i:i + 1])
        assert masks1[0] == masks4[i]
        torch.testing.assert_close(out1[0][0], out4[0][i], rtol=1e-5, atol=1e-5)
    order = [2, 0, 3, 1]                                      # another order
    _, shuffled = _masks(model, x[order], [keys[i] for i in order])
    assert [shuffled[j] for j in range(4)] == [masks4[i] for i in order]
    # the same pixels under other names: other masks; the same name: the same mask
    same = x[:1].expand(4, -1, -1, -1).contiguous()
    _, by_name = _masks(model, same, keys)
    assert len({tuple(m) for m in by_name}) == 4
    _, one_name = _masks(model, same, ['a.png'] * 4)
    assert len({tuple(m) for m in one_name}) == 1 and one_name[0] == masks4[0]
    # another seed: another mask
    model.set_token_reduction(dict(type='RandomPrune', ratio=0.27, seed=4))
    _, other_seed = _masks(model, x, keys)
    assert other_seed != masks4


def test_without_identities_the_position_decides_and_the_log_says_so():
    model = _model()
    x = torch.randn(2, 3, 32, 32)
    logger = MMLogger.get_current_instance()
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        _, anonymous = _masks(model, x, None)
        _masks(model, x, None)
    finally:
        logger.removeHandler(handler)
    warned = [r.getMessage() for r in records if 'RandomPrune' in r.getMessage()]
    assert len(warned) == 1 and 'position in the batch' in warned[0]
    _, positional = _masks(model, x, ['#0', '#1'])
    assert anonymous == positional


def test_image_keys_come_from_the_data_samples():
    def sample(**meta):
        s = BaseDataElement()
        s.set_metainfo(meta)
        return s
    batch = dict(inputs=[None] * 3, data_samples=[
        sample(img_path='/data/val/img_1.jpg'), sample(img_id=7), sample(sample_idx=3)])
    assert image_keys(batch) == ['img_1.jpg', 'img_id:7', 'sample_idx:3']
    assert image_keys(dict(inputs=[], data_samples=[sample(ori_shape=(2, 2))])) is None
    assert image_keys([[1, 2]]) is None


@pytest.mark.slow
def test_prune_eval_batch_one_and_eight_give_the_same_per_image_results(tmp_path):
    """Through ``tools/prune_eval.py``: random pruning on the segmentation demo model with a
    test batch of 1 and of 8 gives the same mIoU and the same per-image intersections and
    unions."""
    from amvim_mm.datasets import make_toy_shapes
    root = make_toy_shapes(str(tmp_path / 'toy'), num_train=1, num_val=8)
    cfg = osp.join(ROOT, 'configs/demo/vim-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py')
    ckpt = osp.join(ROOT, 'checkpoints/demo/vim-demo-seed0_toyshapes-64x64.pth')
    results = {}
    for batch in (1, 8):
        out = tmp_path / f'b{batch}'
        proc = subprocess.run(
            [sys.executable, osp.join(ROOT, 'tools/prune_eval.py'), cfg, ckpt, '--methods',
             'random', '--ratios', '0.46', '--seeds', '0', '1', '--names', 'vim', '--out-dir',
             str(out), '--replicates', '40', '--cfg-options',
             f'test_dataloader.dataset.data_root={root}', f'test_dataloader.batch_size={batch}'],
            cwd=str(tmp_path), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=dict(os.environ, OMP_NUM_THREADS='1'), timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:]
        data = json.loads((out / 'results.json').read_text())
        row = next(r for r in data['results'] if r['method'] == 'random' and r['ratio'] > 0)
        per_seed, keys = S.loads(str(out / row['stats_file']))
        results[batch] = (row['metric_seeds'], per_seed, keys)
    (m1, s1, k1), (m8, s8, k8) = results[1], results[8]
    assert k1 == k8 and len(k1) == 8
    assert m1 == m8
    for a, b in zip(s1, s8, strict=True):
        for name in ('intersect', 'union'):
            np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-6)
