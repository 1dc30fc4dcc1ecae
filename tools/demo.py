"""The README's main job.

For now (the pruning-robustness demo on built-in data is a later milestone) it runs the
environment check and one tiny end-to-end forward through mmseg: an ``EncoderDecoder`` with the
``Vim`` test architecture as its backbone, built by type name from the mmseg scope, on a random
image. It says that this is what it does.
"""
import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    root = Path(__file__).resolve().parent
    print('== amvim_mm demo (interim): environment check + tiny mmseg forward ==', flush=True)
    rc = subprocess.call([sys.executable, str(root / 'check_env.py')])
    if rc != 0:
        print('environment check failed; see above', file=sys.stderr)
        return rc
    from mmengine.config import ConfigDict
    from mmengine.registry import init_default_scope

    import amvim_mm  # noqa: F401
    init_default_scope('mmseg')
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample
    cfg = ConfigDict(
        type='EncoderDecoder',
        data_preprocessor=dict(type='SegDataPreProcessor', mean=[123.675, 116.28, 103.53],
                               std=[58.395, 57.12, 57.375], bgr_to_rgb=True, size=(64, 64)),
        backbone=dict(type='Vim', arch='test', img_size=64, out_type='featmap',
                      out_indices=(-1, ), with_cls_token=False),
        decode_head=dict(type='FCNHead', in_channels=32, channels=16, num_convs=1,
                         num_classes=150, in_index=0, norm_cfg=dict(type='BN'),
                         loss_decode=dict(type='CrossEntropyLoss')),
        train_cfg=dict(), test_cfg=dict(mode='whole'))
    model = MODELS.build(cfg).eval()
    img = torch.randint(0, 255, (3, 64, 64), dtype=torch.uint8)
    data = dict(inputs=[img], data_samples=[SegDataSample(metainfo=dict(
        img_shape=(64, 64), ori_shape=(64, 64)))])
    t = time.perf_counter()
    with torch.no_grad():
        out = model.test_step(data)
    dt = time.perf_counter() - t
    pred = out[0].pred_sem_seg.data
    print(f'mmseg EncoderDecoder(Vim test arch + FCNHead): prediction {tuple(pred.shape)} '
          f'with classes in [{int(pred.min())}, {int(pred.max())}], {dt * 1000:.0f} ms on CPU')
    print('demo OK (random weights: this checks the install, it is not a result)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
