"""The checkpoints the project ships carry the SHA-256 of their weights, and a flipped bit is
refused on every load: ours, and mmseg's own ``tools/test.py`` (before, the damaged file scored
a lower mIoU with exit status 0)."""
import glob
import importlib.util
import os.path as osp
import shutil
import struct
import subprocess
import sys
import zipfile

import pytest
import torch

from amvim_mm.datasets import make_toy_shapes
from amvim_mm.errors import CheckpointError
from amvim_mm.utils.safe_load import HASH_KEY, load_checkpoint_file, state_dict_sha256
from tests.test_tools_e2e import ROOT, _env

CKPT_DIR = osp.join(ROOT, 'checkpoints', 'demo')
SEG_CKPT = osp.join(CKPT_DIR, 'vim-demo-seed0_toyshapes-64x64.pth')
SEG_CONFIG = osp.join(ROOT, 'configs', 'demo',
                      'vim-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py')
DAMAGED = 'the weights do not match the SHA-256 recorded when the file was written'


def _demo_tool():
    spec = importlib.util.spec_from_file_location('_tool_demo', osp.join(ROOT, 'tools',
                                                                         'demo.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def flip_bit(src: str, dst: str, member: str = 'data/1') -> None:
    """Copy ``src`` with the lowest bit of the first byte of the zip member ``*/<member>`` (a
    tensor's storage, stored uncompressed) flipped in place, as damage on a disk would."""
    shutil.copyfile(src, dst)
    with zipfile.ZipFile(src) as z:
        info = next(i for i in z.infolist() if i.filename.endswith('/' + member))
    assert info.compress_type == zipfile.ZIP_STORED
    with open(dst, 'r+b') as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack('<HH', f.read(4))
        f.seek(info.header_offset + 30 + name_len + extra_len)
        byte = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([byte ^ 1]))


def test_shipped_checkpoints_carry_the_hash_of_their_weights():
    demo = _demo_tool()
    files = sorted(glob.glob(osp.join(CKPT_DIR, '*.pth')))
    # every demo checkpoint the demo takes (each task's models x their training seeds) is
    # shipped, plus the learned-reducer demo's (Vim and AMVim, seeds 0-2)
    wanted = {osp.basename(demo.ckpt_path(name, seed)) for task, (*_, models) in
              demo.TASKS.items() for name, _ in models for seed in demo.SEEDS[task]}
    wanted |= {f'{a}-demo-dynamicvit-seed{s}_toyshapes-64x64.pth' for a in ('vim', 'amvim')
               for s in (0, 1, 2)}
    assert [osp.basename(f) for f in files] == sorted(wanted)
    sums = demo.read_sums()
    assert sorted(sums) == [osp.basename(f) for f in files]
    for path in files:
        assert demo.sha256(path) == sums[osp.basename(path)], path
        ck = load_checkpoint_file(path)   # verifies the recorded hash
        assert ck['meta'][HASH_KEY] == state_dict_sha256(ck['state_dict']), path


def test_demo_export_records_the_hash(tmp_path):
    sd = {'backbone.w': torch.arange(6.0).reshape(2, 3), 'head.b': torch.ones(3)}
    src = tmp_path / 'iter_4.pth'
    torch.save(dict(state_dict=sd, meta=dict(iter=4), optimizer={}), src)
    dst = tmp_path / 'exported.pth'
    _demo_tool().export_weights(str(src), str(dst), 'configs/x.py', 'python tools/train.py x')
    ck = load_checkpoint_file(dst)
    assert sorted(ck) == ['meta', 'state_dict']
    assert ck['meta'] == dict(config='configs/x.py', command='python tools/train.py x', iter=4,
                              **{HASH_KEY: state_dict_sha256(sd)})


def test_a_flipped_bit_in_a_shipped_checkpoint_is_refused(tmp_path):
    bad = tmp_path / 'flipped.pth'
    flip_bit(SEG_CKPT, str(bad))
    # exactly one weight changed, by one bit of its mantissa: still finite, nearly the same
    raw, good = load_checkpoint_file(bad, check=False), load_checkpoint_file(SEG_CKPT)
    changed = [k for k, v in good['state_dict'].items() if not torch.equal(v, raw['state_dict'][k])]
    assert len(changed) == 1 and torch.isfinite(raw['state_dict'][changed[0]]).all()
    with pytest.raises(CheckpointError) as err:
        load_checkpoint_file(bad)
    assert str(err.value) == (f'{bad}: {DAMAGED}; the file is damaged (e.g. a flipped bit)')


@pytest.mark.slow
def test_mmseg_test_tool_refuses_a_flipped_bit(tmp_path):
    """mmseg's own ``tools/test.py`` on the demo config: a non-zero exit with our message."""
    import mmseg
    data_root = make_toy_shapes(str(tmp_path / 'toy'), num_train=1, num_val=2)
    bad = tmp_path / 'flipped.pth'
    flip_bit(SEG_CKPT, str(bad))
    script = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools', 'test.py')
    env = dict(_env(), OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    proc = subprocess.run(
        [sys.executable, script, SEG_CONFIG, str(bad), '--work-dir', str(tmp_path / 'work'),
         '--cfg-options', f'test_dataloader.dataset.data_root={data_root}'],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert f'CheckpointError: {bad}: {DAMAGED}' in proc.stderr, proc.stderr[-3000:]
