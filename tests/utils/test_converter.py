"""tools/model_converters/vim2amvim_mm.py: official file -> clean checkpoint, round trip."""
import argparse
import subprocess
import sys
from pathlib import Path

import torch

import amvim_mm  # noqa: F401
from amvim_mm.registry import MODELS
from amvim_mm.utils.checkpoint import convert_vim_official
from tests.reference.official_vim import random_official_state_dict

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / 'tools' / 'model_converters' / 'vim2amvim_mm.py'


def test_pure_converter_keys():
    m = MODELS.build(dict(type='Vim', arch='test'))
    sd = random_official_state_dict(m)
    out = convert_vim_official(sd)
    assert set(out) == {'backbone.' + k for k in m.state_dict()} | {'head.fc.weight',
                                                                     'head.fc.bias'}
    assert torch.equal(out['head.fc.weight'], sd['head.weight'])
    assert 'head.fc.weight' not in convert_vim_official(sd, with_head=False)


def test_cli_round_trip(tmp_path):
    m = MODELS.build(dict(type='Vim', arch='test', img_size=64))
    sd = random_official_state_dict(m)
    src = tmp_path / 'vim_official.pth'
    torch.save({'model': sd, 'args': argparse.Namespace(lr=1)}, src)
    dst = tmp_path / 'clean.pth'
    r = subprocess.run([sys.executable, str(TOOL), str(src), str(dst)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert 'wrote' in r.stdout
    ck = torch.load(dst, weights_only=True)
    assert ck['meta']['converter'] == 'vim2amvim_mm'
    # the clean file loads strictly into a backbone and gives the same weights
    b = MODELS.build(dict(type='AMVim', arch='test', img_size=64,
                          init_cfg=dict(type='Pretrained', checkpoint=str(dst))))
    b.init_weights()
    for k, v in b.state_dict().items():
        assert torch.equal(v, sd[k])


def test_cli_bad_input(tmp_path):
    bad = tmp_path / 'bad.pth'
    torch.save({'model': {'w': torch.ones(1)}}, bad)
    r = subprocess.run([sys.executable, str(TOOL), str(bad), str(tmp_path / 'o.pth')],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and 'not an official Vim state dict' in r.stderr
    r = subprocess.run([sys.executable, str(TOOL), str(tmp_path / 'none.pth'),
                        str(tmp_path / 'o.pth')], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and 'checkpoint file not found' in r.stderr


def test_cli_never_overwrites_its_source_and_refuses_a_folder(tmp_path):
    m = MODELS.build(dict(type='Vim', arch='test', img_size=64))
    src = tmp_path / 'vim_official.pth'
    torch.save({'model': random_official_state_dict(m)}, src)
    before = src.read_bytes()
    for dst, expect in ((src, 'is the input file'), (tmp_path, 'is a directory'),
                        (tmp_path / '.' / src.name, 'is the input file')):
        r = subprocess.run([sys.executable, str(TOOL), str(src), str(dst)], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 2 and expect in r.stderr, r.stderr
        assert 'Traceback' not in r.stderr
    assert src.read_bytes() == before


def test_cli_output_records_the_weights_hash(tmp_path):
    from amvim_mm.utils.safe_load import HASH_KEY, state_dict_sha256
    m = MODELS.build(dict(type='Vim', arch='test', img_size=64))
    src = tmp_path / 'vim_official.pth'
    torch.save({'model': random_official_state_dict(m)}, src)
    dst = tmp_path / 'clean.pth'
    r = subprocess.run([sys.executable, str(TOOL), str(src), str(dst)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ck = torch.load(dst, weights_only=True)
    assert ck['meta'][HASH_KEY] == state_dict_sha256(ck['state_dict'])


VMAMBA_TOOL = ROOT / 'tools' / 'model_converters' / 'vmamba2amvim_mm.py'


def test_vmamba_cli_round_trip(tmp_path):
    from tests.reference.official_vmamba import random_official_state_dict as vmamba_sd
    arch = dict(dims=16, depths=(1, 1, 2, 1), ssm_ratio=1.0, d_state=1, mlp_ratio=4.0,
                forward_type='v05_noz', patch_embed='v2', downsample='v3')
    sd = vmamba_sd(arch, num_classes=7, seed=0)
    src = tmp_path / 'vssm_official.pth'
    torch.save({'model': sd, 'epoch': 3}, src)
    dst = tmp_path / 'clean.pth'
    r = subprocess.run([sys.executable, str(VMAMBA_TOOL), str(src), str(dst)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ck = torch.load(dst, weights_only=True)
    assert ck['meta']['converter'] == 'vmamba2amvim_mm'
    assert torch.equal(ck['state_dict']['head.fc.weight'], sd['classifier.head.weight'])
    assert torch.equal(ck['state_dict']['backbone.classifier.norm.weight'],
                       sd['classifier.norm.weight'])
    b = MODELS.build(dict(type='VMamba', arch='test',
                          init_cfg=dict(type='Pretrained', checkpoint=str(dst))))
    b.init_weights()
    for k, v in b.state_dict().items():
        if not k.startswith('outnorm'):
            assert torch.equal(v, sd[k]), k
    # a Vim file is not a VMamba file
    vim = tmp_path / 'vim.pth'
    torch.save({'model': random_official_state_dict(MODELS.build(dict(type='Vim',
                                                                      arch='test')))}, vim)
    r = subprocess.run([sys.executable, str(VMAMBA_TOOL), str(vim), str(tmp_path / 'o.pth')],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and 'not an official VMamba state dict' in r.stderr
