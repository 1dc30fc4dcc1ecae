"""Checkpoints named by URL or prefix go through the allow-list loader, on every path that reads
them: mmengine's ``load_checkpoint`` and ``CheckpointLoader`` (a Runner's ``load_from``), a
``Pretrained`` init_cfg, our backbones' ``Pretrained`` and mmseg's own ``tools/test.py``.

There is no network here: the files are put where torch.hub keeps downloads
(``$TORCH_HOME/hub/checkpoints/<the URL's file name>``) and the URLs point at
``example.invalid``; a download attempt fails the test unless the test serves one itself.
"""
import os
import os.path as osp
import subprocess
import sys
import zipfile

import pytest
import torch
import torch.nn as nn
from mmengine.model import BaseModule
from mmengine.runner import load_checkpoint as mmengine_load_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader

import amvim_mm  # noqa: F401  (registers the loaders)
from amvim_mm.errors import CheckpointError, UnsafeCheckpointError
from amvim_mm.models.backbones import Vim
from amvim_mm.utils import remote_checkpoint
from amvim_mm.utils.compat import MMENGINE_LOADERS

URL = 'https://example.invalid/weights/evil.pth'
# prefixed names and the file names of their URLs in mmengine 0.10.7's tables
PREFIXED = {
    'torchvision://resnet18': 'resnet18-f37072fd.pth',
    'modelzoo://resnet18': 'resnet18-f37072fd.pth',
    'open-mmlab://resnet50_v1c': 'resnet50_v1c-2cccc1ad.pth',
    'openmmlab://resnet50_v1c': 'resnet50_v1c-2cccc1ad.pth',
    'mmcls://resnet50': 'resnet50_8xb32_in1k_20210831-ea4938fc.pth',
}


class Touch:
    """Unpickling this runs ``open(marker, 'w')`` - i.e. arbitrary code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, 'w'))


class Payload:
    """A harmless custom type (needs full unpickling, runs no code)."""


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty torch.hub cache and mmengine home; returns the folder of cached checkpoints."""
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch'))
    monkeypatch.setenv('MMENGINE_HOME', str(tmp_path / 'mmengine'))
    for name in ('AMVIM_UNSAFE_LOAD', 'AMVIM_TRUSTED_DIRS', 'AMVIM_ALLOW_UNSAFE_LOAD'):
        monkeypatch.delenv(name, raising=False)
    cache = tmp_path / 'torch' / 'hub' / 'checkpoints'
    cache.mkdir(parents=True)
    return cache


@pytest.fixture
def no_download(monkeypatch):
    def refuse(url, path, progress):
        pytest.fail(f'a download was attempted although the file is cached: {url}')
    monkeypatch.setattr(remote_checkpoint, '_download', refuse)


def _mmengine_load_checkpoint(name):
    return mmengine_load_checkpoint(nn.Linear(1, 1), name, map_location='cpu')


def _checkpoint_loader(name):   # what Runner.load_checkpoint (load_from, resume) calls
    return CheckpointLoader.load_checkpoint(name, map_location='cpu')


def _pretrained_init_cfg(name):
    head = BaseModule(init_cfg=dict(type='Pretrained', checkpoint=name))
    head.fc = nn.Linear(1, 1)
    head.init_weights()


def _our_backbone(name):
    Vim(arch='test', img_size=32, init_cfg=dict(type='Pretrained', checkpoint=name)).init_weights()


ROUTES = {'mmengine load_checkpoint': _mmengine_load_checkpoint,
          'CheckpointLoader': _checkpoint_loader, 'Pretrained init_cfg': _pretrained_init_cfg,
          'our backbone': _our_backbone}


@pytest.mark.parametrize('route,name', [*[(r, URL) for r in ROUTES],
                                        *[('CheckpointLoader', n) for n in PREFIXED],
                                        ('our backbone', 'torchvision://resnet18')])
def test_a_hostile_file_by_url_or_prefix_never_runs(hub, no_download, tmp_path, route, name):
    marker = tmp_path / 'pwned'
    cached = hub / PREFIXED.get(name, 'evil.pth')
    torch.save({'state_dict': {'w': torch.ones(1)}, 'x': Touch(marker)}, cached)
    with pytest.raises(UnsafeCheckpointError) as e:
        ROUTES[route](name)
    msg = str(e.value)
    assert 'cannot be loaded safely: it pickles io.open' in msg, msg
    assert msg.endswith(f'AMVIM_UNSAFE_LOAD={cached}') and '\n' not in msg
    assert not marker.exists()


def test_the_opt_in_names_the_file_by_its_path_in_the_cache(hub, no_download, monkeypatch):
    cached = hub / 'evil.pth'
    torch.save({'state_dict': {'w': torch.ones(1)}, 'extra': Payload()}, cached)
    monkeypatch.setenv('AMVIM_UNSAFE_LOAD', URL)   # the URL is not the file
    with pytest.raises(UnsafeCheckpointError):
        CheckpointLoader.load_checkpoint(URL)
    monkeypatch.setenv('AMVIM_UNSAFE_LOAD', str(cached))
    assert isinstance(CheckpointLoader.load_checkpoint(URL)['extra'], Payload)
    assert isinstance(remote_checkpoint.load_checkpoint(URL)['extra'], Payload)


def test_a_good_file_by_url_loads_the_saved_weights(hub, no_download, tmp_path):
    saved = nn.Linear(3, 2)
    torch.save({'state_dict': saved.state_dict()}, hub / 'linear.pth')
    model = nn.Linear(3, 2)
    mmengine_load_checkpoint(model, 'https://example.invalid/a/linear.pth?download=1')
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.state_dict().items())
    # an official Vim file for our backbone's Pretrained, from a URL
    official = Vim(arch='test', img_size=32).state_dict()
    torch.save({'model': official}, hub / 'vim_test.pth')
    vim = Vim(arch='test', img_size=32,
              init_cfg=dict(type='Pretrained', checkpoint='https://example.invalid/vim_test.pth'))
    vim.init_weights()
    assert all(torch.equal(vim.state_dict()[k], v) for k, v in official.items())
    # torch.hub's old format, a zip holding one legacy file: extracted into its own folder
    legacy = tmp_path / 'inner.pth'
    torch.save(saved.state_dict(), legacy, _use_new_zipfile_serialization=False)
    with zipfile.ZipFile(hub / 'old.zip', 'w') as archive:
        archive.write(legacy, 'inner.pth')
    sd = remote_checkpoint.load_checkpoint('https://example.invalid/old.zip')
    assert torch.equal(sd['weight'], saved.weight) and not (hub / 'inner.pth').exists()
    (folder, ) = hub.glob('.old.zip.*.unpacked')
    assert (folder / 'inner.pth').is_file()
    again = remote_checkpoint.load_checkpoint('https://example.invalid/old.zip')
    assert torch.equal(again['weight'], saved.weight) and len(list(hub.glob('.*'))) == 1


def _sha(path):
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_remote_zip_never_overwrites_a_cached_file(hub, no_download, tmp_path, monkeypatch):
    """Issue 52, defect 1: a zip's member named like another cached checkpoint replaced it
    (the next load by URL evaluated the attacker's weights), or like a file trusted with
    AMVIM_UNSAFE_LOAD (its payload ran on the next load). Members go into a fresh folder of
    their own; the cached and trusted files keep their bytes."""
    victim, attacker = nn.Linear(3, 2), nn.Linear(3, 2)
    torch.save({'state_dict': victim.state_dict()}, hub / 'victim.pth')
    trusted = hub / 'trusted.pth'
    torch.save({'state_dict': victim.state_dict(), 'extra': Payload()}, trusted)
    before = {p.name: _sha(p) for p in (hub / 'victim.pth', trusted)}
    evil = tmp_path / 'evil.pth'
    torch.save({'state_dict': attacker.state_dict()}, evil)
    for name in ('victim.pth', 'trusted.pth'):
        with zipfile.ZipFile(hub / f'pack-{name}.zip', 'w') as archive:
            archive.write(evil, name)
        sd = remote_checkpoint.load_checkpoint(f'https://host.invalid/pack-{name}.zip')
        assert torch.equal(sd['state_dict']['weight'], attacker.weight)
    assert {p.name: _sha(p) for p in (hub / 'victim.pth', trusted)} == before
    sd = remote_checkpoint.load_checkpoint('https://host.invalid/victim.pth')
    assert torch.equal(sd['state_dict']['weight'], victim.weight)
    monkeypatch.setenv('AMVIM_UNSAFE_LOAD', str(trusted))
    sd = remote_checkpoint.load_checkpoint('https://host.invalid/trusted.pth')
    assert isinstance(sd['extra'], Payload)


@pytest.mark.parametrize('member,why', [
    ('../escape.pth', '".."'), ('/tmp/abs.pth', 'absolute'), ('C:/x.pth', 'absolute'),
    ('dir/./x.pth', '"."'), ('link.pth', 'symbolic link')])
def test_a_zip_whose_member_could_escape_is_refused(hub, no_download, tmp_path, member, why):
    info = zipfile.ZipInfo(member)
    if why == 'symbolic link':
        info.external_attr = (0o120777 << 16)
    with zipfile.ZipFile(hub / 'bad.zip', 'w') as archive:
        archive.writestr(info, '../../victim.pth' if why == 'symbolic link' else b'x')
    before = sorted(p.name for p in tmp_path.rglob('*'))
    with pytest.raises(CheckpointError, match=f'refusing the zip.*{why}') as err:
        remote_checkpoint.load_checkpoint('https://host.invalid/bad.zip')
    assert '\n' not in str(err.value)
    assert sorted(p.name for p in tmp_path.rglob('*')) == before


def test_our_tools_take_a_checkpoint_by_url(hub, no_download, tmp_path):
    """``tools/test.py`` / ``prune_eval`` load weights with ``load_model_weights``: a URL goes
    through the same cache and allow-list (a good file loads, a hostile one is refused)."""
    from amvim_mm.apis.runner import load_model_weights
    saved = nn.Linear(3, 2)
    torch.save({'state_dict': saved.state_dict()}, hub / 'good.pth')
    model = nn.Linear(3, 2)
    load_model_weights(model, 'https://example.invalid/good.pth')
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.state_dict().items())
    marker = tmp_path / 'ran'
    torch.save({'state_dict': saved.state_dict(), 'x': Touch(marker)}, hub / 'bad.pth')
    with pytest.raises(UnsafeCheckpointError, match='cannot be loaded safely'):
        load_model_weights(model, 'https://example.invalid/bad.pth')
    assert not marker.exists()


def test_a_missing_file_is_downloaded_once_to_torch_hubs_path(hub, tmp_path):
    served = tmp_path / 'served' / 'good.pth'
    served.parent.mkdir()
    torch.save({'state_dict': {'w': torch.arange(3)}}, served)
    path = remote_checkpoint.cached_file(served.as_uri())   # torch.hub's downloader, no network
    assert path == str(hub / 'good.pth')
    served.unlink()                                          # cached now: nothing is fetched
    assert torch.equal(remote_checkpoint.load_from_http(served.as_uri())['state_dict']['w'],
                       torch.arange(3))
    gone = (tmp_path / 'served' / 'gone.pth').as_uri()
    with pytest.raises(CheckpointError) as e:
        remote_checkpoint.cached_file(gone)
    assert str(e.value).startswith(f'{gone}: download failed (')
    assert str(e.value).endswith(f'to use the file without a download, put it at {hub}/gone.pth')


def test_ceph_and_pavi_are_safe_or_one_line_errors(hub, tmp_path):
    from mmengine.fileio import BaseStorageBackend, PetrelBackend, register_backend
    with pytest.raises(CheckpointError, match=r'^s3://bucket/x\.pth: cannot read it \(.*'
                       r'petrel_client'):
        CheckpointLoader.load_checkpoint('s3://bucket/x.pth')
    with pytest.raises(CheckpointError, match='pavi:// needs the pavi package'):
        CheckpointLoader.load_checkpoint('pavi://models/x.pth')
    marker = tmp_path / 'pwned'
    evil = tmp_path / 'evil.pth'
    torch.save({'x': Touch(marker)}, evil)

    class Served(BaseStorageBackend):
        def __init__(self, **kwargs):
            pass

        def get(self, filepath):
            return evil.read_bytes()

        def get_text(self, filepath, encoding='utf-8'):
            raise NotImplementedError

    register_backend('petrel', Served, force=True)
    try:
        with pytest.raises(UnsafeCheckpointError) as e:
            CheckpointLoader.load_checkpoint('s3://bucket/evil.pth')
    finally:
        register_backend('petrel', PetrelBackend, force=True)
    assert str(e.value) == ('s3://bucket/evil.pth cannot be loaded safely: it pickles io.open, '
                            'which could run code; if you trust it, save it as a local file and '
                            'name that file in AMVIM_UNSAFE_LOAD')
    assert not marker.exists()


def test_every_prefix_is_ours_after_the_libraries_are_imported():
    """mmseg, mmdet and mmpretrain register no loader of their own (a later registration of a
    prefix we hold would need ``force=True``: mmengine raises ``KeyError`` otherwise)."""
    import mmdet.models  # noqa: F401
    import mmpretrain.models  # noqa: F401
    import mmseg.models  # noqa: F401
    assert dict(CheckpointLoader._schemes) == MMENGINE_LOADERS
    assert CheckpointLoader._get_checkpoint_loader('open-mmlab:s3://b/x.pth').__name__ == \
        'load_from_ceph'


@pytest.mark.slow
def test_mmseg_test_tool_refuses_a_hostile_file_by_url(hub, tmp_path):
    """mmseg's own tools/test.py (Runner ``load_from``) with a URL whose download is cached."""
    import mmseg

    from amvim_mm.testing import make_ade20k
    from tests.test_tools_e2e import SEG_BASE, SEG_CONFIG, _env, write_config
    data_root = make_ade20k(tmp_path / 'ade', num_train=2, num_val=2, size=(64, 64), seed=0)
    cfg = write_config(tmp_path / 'vim-test_upernet_ade-64x64.py',
                       SEG_CONFIG.format(base=SEG_BASE, data_root=data_root))
    marker = tmp_path / 'pwned'
    cached = hub / 'seg_evil.pth'
    torch.save({'state_dict': {'w': torch.ones(1)}, 'x': Touch(marker)}, cached)
    script = osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools', 'test.py')
    url = 'https://example.invalid/seg/seg_evil.pth'
    proc = subprocess.run([sys.executable, script, str(cfg), url, '--work-dir',
                           str(tmp_path / 'work')], cwd=str(tmp_path),
                          env=dict(_env(), TORCH_HOME=os.environ['TORCH_HOME']),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    refusal = (f'{url} (cached as {cached}) cannot be loaded safely: it pickles io.open, which '
               f'could run code; if you trust this file, name it: AMVIM_UNSAFE_LOAD={cached}')
    assert refusal in proc.stderr.splitlines()[-1], proc.stderr[-3000:]
    assert 'Downloading' not in proc.stdout + proc.stderr
    assert not marker.exists()
