"""The input check through a library's own tool: NaN/inf images from a zero ``std`` stop
mmseg's ``tools/test.py`` on the PlainMamba demo (was: exit 0 and a mIoU of NaN outputs)."""
import os.path as osp
import subprocess
import sys

import pytest

from amvim_mm.datasets import make_toy_shapes
from tests.test_tools_e2e import ROOT, _env

PLAIN_CONFIG = osp.join(ROOT, 'configs/demo/plainmamba-demo_pyramid_upernet_1xb8-2k_'
                              'toyshapes-64x64.py')
PLAIN_CKPT = osp.join(ROOT, 'checkpoints/demo/plainmamba-demo-seed0_toyshapes-64x64.pth')


@pytest.mark.slow
def test_mmseg_test_tool_stops_on_non_finite_images(tmp_path):
    import mmseg
    data_root = make_toy_shapes(str(tmp_path / 'toy'), num_train=1, num_val=2)
    script = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools', 'test.py')
    env = dict(_env(), OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    proc = subprocess.run(
        [sys.executable, script, PLAIN_CONFIG, PLAIN_CKPT, '--work-dir', str(tmp_path / 'work'),
         '--cfg-options', f'test_dataloader.dataset.data_root={data_root}',
         'model.data_preprocessor.std=[0,0,0]', 'log_level=WARNING'],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0, proc.stdout[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    # every pixel is +-inf (or NaN where it equals the mean): the whole 2 x 3 x 64 x 64 batch
    assert last.startswith('amvim_mm.errors.ConfigError: PlainMamba: the input images hold '), \
        proc.stderr[-3000:]
    assert last.endswith(' non-finite (NaN or inf) values of 24576 (input shape '
                         '(2, 3, 64, 64)); every output would be NaN'), last
    assert 'mIoU' not in proc.stdout + proc.stderr
