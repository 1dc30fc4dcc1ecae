"""Safe checkpoint loading on torch >= 2.6 (amvim_mm.utils.compat)."""
import argparse
import collections

import pytest
import torch
from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint

import amvim_mm  # noqa: F401  (registers the loader)
from amvim_mm.utils import compat


class Evil:
    """A class that must never be unpickled from an untrusted file."""

    def __reduce__(self):
        return (collections.OrderedDict, ())


@pytest.fixture(autouse=True)
def clean_trust(monkeypatch):
    monkeypatch.delenv('AMVIM_TRUSTED_DIRS', raising=False)
    monkeypatch.delenv('AMVIM_ALLOW_UNSAFE_LOAD', raising=False)
    monkeypatch.setattr(compat, '_TRUSTED_DIRS', [])


def test_official_style_file_loads_weights_only(tmp_path):
    p = tmp_path / 'vim.pth'
    torch.save({'model': {'w': torch.ones(2)}, 'args': argparse.Namespace(lr=1e-3)}, p)
    ck = compat.load_checkpoint_file(p)
    assert torch.equal(ck['model']['w'], torch.ones(2))
    assert ck['args'].lr == 1e-3


class Payload:
    pass


def test_untrusted_pickle_is_refused_with_a_clear_error(tmp_path):
    p = tmp_path / 'odd.pth'
    torch.save({'state_dict': {'w': torch.ones(1)}, 'extra': Payload()}, p)
    with pytest.raises(compat.UnsafeCheckpointError) as e:
        compat.load_checkpoint_file(p)
    msg = str(e.value)
    assert 'weights_only=True' in msg and 'Payload' in msg
    assert 'AMVIM_TRUSTED_DIRS' in msg and 'AMVIM_ALLOW_UNSAFE_LOAD=1' in msg


def test_trusted_directory_and_opt_in(tmp_path, monkeypatch):
    p = tmp_path / 'run' / 'iter_2.pth'
    p.parent.mkdir()
    torch.save({'state_dict': {'w': torch.ones(1)}, 'extra': Payload()}, p)
    compat.trust_directory(tmp_path / 'run')
    assert isinstance(compat.load_checkpoint_file(p)['extra'], Payload)
    monkeypatch.setattr(compat, '_TRUSTED_DIRS', [])
    monkeypatch.setenv('AMVIM_TRUSTED_DIRS', str(tmp_path))
    assert isinstance(compat.load_checkpoint_file(p)['extra'], Payload)
    monkeypatch.delenv('AMVIM_TRUSTED_DIRS')
    monkeypatch.setenv('AMVIM_ALLOW_UNSAFE_LOAD', '1')
    assert isinstance(compat.load_checkpoint_file(p)['extra'], Payload)
    # an explicit trusted=False wins over the opt-in
    with pytest.raises(compat.UnsafeCheckpointError):
        compat.load_checkpoint_file(p, trusted=False)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match='checkpoint file not found: /no/such.pth'):
        compat.load_checkpoint_file('/no/such.pth')


def test_mmengine_uses_our_loader(tmp_path):
    assert CheckpointLoader._schemes[''] is compat._mmengine_local_loader
    p = tmp_path / 'odd.pth'
    torch.save({'state_dict': {'w': torch.ones(1)}, 'extra': Payload()}, p)
    with pytest.raises(compat.UnsafeCheckpointError):
        _load_checkpoint(str(p), map_location='cpu')
    compat.trust_directory(tmp_path)
    assert isinstance(_load_checkpoint(str(p), map_location='cpu')['extra'], Payload)
