"""Safe checkpoint reading (amvim_mm.utils.safe_load) and its registration in mmengine.

The hostile files here would run code if they were unpickled fully: they create a marker file.
Every test checks that the marker never appears. Others carry numpy dtypes whose pickled state
claims Python objects, which numpy fails on ("Internal error") wherever such an array is used or
freed.
"""
import argparse
import logging
import os
import pickle

import numpy as np
import pytest
import torch
from mmengine.config import ConfigDict
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint

import amvim_mm  # noqa: F401  (registers the loader)
from amvim_mm.errors import CheckpointError, ConfigError, UnsafeCheckpointError
from amvim_mm.utils import compat, safe_load
from amvim_mm.utils.pickle_scan import ObjectDtypeError, check_dtype
from amvim_mm.utils.safe_load import HASH_KEY, load_checkpoint_file, state_dict_sha256


class Touch:
    """Unpickling this runs ``open(marker, 'w')`` - i.e. arbitrary code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, 'w'))


class GetattrEscape:
    """A pickle that walks from an allowed class to its module's globals with ``getattr``."""

    def __reduce__(self):
        return (getattr, (HistoryBuffer.__init__, '__globals__'))


class Payload:
    """A harmless custom type (needs full unpickling, runs no code)."""


class System:
    """Unpickling this runs ``os.system('touch <marker>')``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}', ))


class CraftedDtype:
    """Pickles as ``numpy.dtype('f8')`` whose state (the last item: the flags) claims objects."""

    def __init__(self, flags):
        self.flags = flags

    def __reduce__(self):
        return (np.dtype, ('f8', False, True), (3, '<', None, None, None, -1, -1, self.flags))


class CraftedArray:
    """Pickles as a float64 ``ndarray`` whose dtype is a :class:`CraftedDtype`."""

    def __init__(self, flags):
        self.flags = flags

    def __reduce__(self):
        rebuild, args, state = np.zeros(2).__reduce__()
        return rebuild, args, (state[0], state[1], CraftedDtype(self.flags), *state[3:])


def history_buffer_holding(array):
    buf = HistoryBuffer()
    buf._log_history = array
    return buf


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ('AMVIM_UNSAFE_LOAD', 'AMVIM_TRUSTED_DIRS', 'AMVIM_ALLOW_UNSAFE_LOAD'):
        monkeypatch.delenv(name, raising=False)


def evil_file(folder, marker, name='evil.pth'):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    torch.save({'state_dict': {'w': torch.ones(1)}, 'x': Touch(marker)}, path)
    return path


def test_official_style_file_loads_weights_only(tmp_path):
    p = tmp_path / 'vim.pth'
    torch.save({'model': {'w': torch.ones(2)}, 'args': argparse.Namespace(lr=1e-3)}, p)
    ck = load_checkpoint_file(p)
    assert torch.equal(ck['model']['w'], torch.ones(2))
    assert ck['args'].lr == 1e-3


YACS = """\
class CfgNode(dict):
    def __init__(self, init_dict=None):
        init_dict = dict(init_dict or {})
        for k, v in init_dict.items():
            if type(v) is dict:
                init_dict[k] = CfgNode(v)
        super().__init__(init_dict)
        self.__dict__['__immutable__'] = False
        self.__dict__['__deprecated_keys__'] = set()
        self.__dict__['__renamed_keys__'] = {}
        self.__dict__['__new_allowed__'] = False
"""


def test_official_vmamba_file_with_a_yacs_config_loads_weights_only(tmp_path, monkeypatch):
    """Official VMamba training files pickle their yacs ``CfgNode`` config: read as plain
    ordered dicts, without yacs and without running anything."""
    pkg = tmp_path / 'fake' / 'yacs'
    pkg.mkdir(parents=True)
    (pkg / '__init__.py').write_text('')
    (pkg / 'config.py').write_text(YACS)
    monkeypatch.syspath_prepend(str(tmp_path / 'fake'))
    from yacs.config import CfgNode
    p = tmp_path / 'vssm.pth'
    torch.save({'model': {'w': torch.ones(2)}, 'epoch': 264, 'max_accuracy': 82.6,
                'config': CfgNode({'MODEL': {'NAME': 'vssm1_tiny_0230s'}})}, p)
    monkeypatch.delitem(__import__('sys').modules, 'yacs.config')
    ck = load_checkpoint_file(p)
    assert torch.equal(ck['model']['w'], torch.ones(2))
    assert ck['config']['MODEL']['NAME'] == 'vssm1_tiny_0230s'
    assert type(ck['config']).__module__ == 'collections'


def test_code_in_a_pickle_never_runs(tmp_path):
    marker = tmp_path / 'pwned'
    p = evil_file(tmp_path, marker)
    with pytest.raises(UnsafeCheckpointError) as e:
        load_checkpoint_file(p)
    msg = str(e.value)
    assert 'io.open' in msg and f'AMVIM_UNSAFE_LOAD={p}' in msg
    assert not marker.exists()


@pytest.mark.parametrize('where', ['work_dirs', 'work_dirs/run', 'symlinked_work_dirs'])
def test_no_place_is_trusted(tmp_path, monkeypatch, where):
    """Earlier versions trusted ./work_dirs, a run's work dir and AMVIM_TRUSTED_DIRS."""
    marker = tmp_path / 'pwned'
    monkeypatch.chdir(tmp_path)
    if where == 'symlinked_work_dirs':
        real = tmp_path / 'elsewhere'
        real.mkdir()
        os.symlink(real, tmp_path / 'work_dirs')
        p = evil_file(tmp_path / 'work_dirs', marker)
    else:
        p = evil_file(tmp_path / where, marker)
    for env in ({}, {'AMVIM_TRUSTED_DIRS': '.'}, {'AMVIM_TRUSTED_DIRS': str(p.parent)},
                {'AMVIM_ALLOW_UNSAFE_LOAD': '1'}):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        with pytest.raises(UnsafeCheckpointError):
            load_checkpoint_file(p)
        with pytest.raises(UnsafeCheckpointError):   # mmengine's own loading path
            _load_checkpoint(str(p), map_location='cpu')
        for k in env:
            monkeypatch.delenv(k)
    assert not marker.exists()


def test_getattr_is_restricted_to_history_buffer_statistics(tmp_path):
    p = tmp_path / 'escape.pth'
    torch.save({'x': GetattrEscape()}, p)
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint_file(p)
    # what mmengine itself pickles still loads
    buf = HistoryBuffer()
    buf.update(1.5)
    q = tmp_path / 'hub.pth'
    torch.save({'state_dict': {'w': torch.ones(1)}, 'hub': buf}, q)
    assert load_checkpoint_file(q)['hub'].current() == 1.5


def test_opt_in_names_the_file_and_is_logged(tmp_path, monkeypatch, caplog):
    p = tmp_path / 'custom.pth'
    torch.save({'state_dict': {'w': torch.ones(1)}, 'extra': Payload()}, p)
    other = tmp_path / 'other.pth'
    other.write_bytes(b'')
    monkeypatch.setenv('AMVIM_UNSAFE_LOAD', str(other))      # another file: still refused
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint_file(p)
    monkeypatch.setenv('AMVIM_UNSAFE_LOAD', str(tmp_path))   # a folder is never enough
    with pytest.raises(ConfigError, match='names the directory'):
        load_checkpoint_file(p)
    monkeypatch.setenv('AMVIM_UNSAFE_LOAD', os.pathsep.join([str(other), str(p)]))
    with caplog.at_level(logging.WARNING, logger='amvim_mm'):
        assert isinstance(load_checkpoint_file(p)['extra'], Payload)
    assert 'FULL unpickling' in caplog.text and str(p) in caplog.text


def test_missing_empty_truncated_and_garbage_files(tmp_path):
    with pytest.raises(FileNotFoundError, match='checkpoint file not found: /no/such.pth'):
        load_checkpoint_file('/no/such.pth')
    empty = tmp_path / 'empty.pth'
    empty.write_bytes(b'')
    with pytest.raises(CheckpointError, match='is empty'):
        load_checkpoint_file(empty)
    good = tmp_path / 'good.pth'
    torch.save({'state_dict': {'w': torch.randn(1000)}}, good)
    cut = tmp_path / 'cut.pth'
    cut.write_bytes(good.read_bytes()[:len(good.read_bytes()) // 2])
    with pytest.raises(CheckpointError, match='not a readable checkpoint'):
        load_checkpoint_file(cut)
    junk = tmp_path / 'junk.pth'
    junk.write_bytes(b'this is not a checkpoint at all' * 10)
    with pytest.raises(CheckpointError, match='not a readable checkpoint'):
        load_checkpoint_file(junk)


@pytest.mark.parametrize('bad', [float('nan'), float('inf')])
def test_non_finite_weights_are_refused(tmp_path, bad):
    w = torch.zeros(4, 4)
    w[1, 2] = bad
    p = tmp_path / 'nan.pth'
    torch.save({'state_dict': {'layers.0.mixer.D': w}}, p)
    with pytest.raises(CheckpointError, match=r"'layers.0.mixer.D' has 1 non-finite"):
        load_checkpoint_file(p)
    torch.save({'model': {'layers.0.mixer.D': w}}, p)   # official layout too
    with pytest.raises(CheckpointError, match='non-finite'):
        load_checkpoint_file(p)


def test_recorded_hash_detects_a_flipped_bit(tmp_path):
    sd = {'a': torch.randn(64, 64), 'b': torch.arange(10)}
    p = tmp_path / 'ours.pth'
    torch.save({'state_dict': sd, 'meta': {HASH_KEY: state_dict_sha256(sd)}}, p)
    assert torch.equal(load_checkpoint_file(p)['state_dict']['a'], sd['a'])
    raw = bytearray(p.read_bytes())
    needle = sd['a'][10, 10].numpy().tobytes()
    at = raw.find(needle)
    assert at > 0
    raw[at] ^= 0x01                  # one bit of one weight: still finite, still a valid zip
    p.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match='do not match the SHA-256'):
        load_checkpoint_file(p)


def test_a_file_without_a_recorded_hash_says_it_is_unverified(tmp_path, monkeypatch):
    """Issue 52, defect 7: a hashed checkpoint with flipped bits and its hash key removed
    loaded with no word that it was unverified. A file without the hash now logs one line
    (once per file), a file with it none."""
    from amvim_mm.utils import safe_load
    said = []
    monkeypatch.setattr('mmengine.logging.print_log',
                        lambda msg, *a, **k: said.append(msg))
    monkeypatch.setattr(safe_load, '_UNVERIFIED', set())
    sd = {'a': torch.randn(4, 4)}
    bare = tmp_path / 'bare.pth'
    torch.save({'state_dict': sd, 'meta': {}}, bare)
    hashed = tmp_path / 'hashed.pth'
    torch.save({'state_dict': sd, 'meta': {HASH_KEY: state_dict_sha256(sd)}}, hashed)
    load_checkpoint_file(hashed)
    assert said == []
    load_checkpoint_file(bare)
    load_checkpoint_file(bare)
    assert len(said) == 1 and 'loaded unverified' in said[0] and 'bare.pth' in said[0]


def test_mmengine_uses_our_loader_and_converts_official_files(tmp_path):
    assert CheckpointLoader._schemes[''] is compat._mmengine_local_loader
    from amvim_mm.models.backbones import Vim
    sd = dict(Vim(arch='test', img_size=32).state_dict())
    sd['head.weight'] = torch.zeros(3, 32)
    sd['head.bias'] = torch.zeros(3)
    p = tmp_path / 'official.pth'
    torch.save({'model': sd, 'args': argparse.Namespace(lr=1)}, p)
    ck = _load_checkpoint(str(p), map_location='cpu')
    assert 'backbone.patch_embed.proj.weight' in ck['state_dict']
    assert 'head.fc.weight' in ck['state_dict'] and 'head.weight' not in ck['state_dict']


def test_retired_variables_are_reported(monkeypatch):
    assert safe_load.retired_env_problems() == []
    monkeypatch.setenv('AMVIM_TRUSTED_DIRS', '/tmp')
    (msg, ) = safe_load.retired_env_problems()
    assert 'AMVIM_TRUSTED_DIRS' in msg and 'AMVIM_UNSAFE_LOAD' in msg


@pytest.mark.filterwarnings('ignore:Detected pickle protocol')   # torch, on the plain pickle
@pytest.mark.parametrize('fmt', ['zip', 'legacy', 'raw'])
def test_refusal_names_what_the_file_pickles_in_every_format(tmp_path, fmt):
    """torch's own text advises turning ``weights_only`` off; ours names the globals and the
    opt-in."""
    marker = tmp_path / 'pwned'
    p = tmp_path / f'evil.{fmt}'
    obj = {'state_dict': {'w': torch.ones(1)}, 'x': System(marker)}
    if fmt == 'raw':
        p.write_bytes(pickle.dumps(obj))
    else:
        torch.save(obj, p, _use_new_zipfile_serialization=fmt == 'zip')
    with pytest.raises(UnsafeCheckpointError) as e:
        load_checkpoint_file(p)
    # a plain pickle of a tensor goes through torch.storage._load_from_bytes (a full torch.load)
    names = ('torch.storage._load_from_bytes, ' if fmt == 'raw' else '') + 'posix.system'
    assert str(e.value) == (f'{p} cannot be loaded safely: it pickles {names}, which could run '
                            f'code; if you trust this file, name it: AMVIM_UNSAFE_LOAD={p}')
    assert not marker.exists()
    harmless = tmp_path / 'plain.pkl'    # not a torch file, nothing unsafe: no advice either
    harmless.write_bytes(pickle.dumps({'w': 1}))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint_file(harmless)
    assert 'not a readable checkpoint' in str(e.value) and 'weights_only' not in str(e.value)


def test_reading_a_crafted_dtypes_flags_does_not_crash():
    dtype = np.dtype('f8', False, True)
    dtype.__setstate__((3, '<', None, None, None, -1, -1, 0x3F))
    with pytest.raises(ObjectDtypeError, match=r"'<f8' \(flags 0x3f\)"):
        check_dtype(dtype)
    check_dtype(np.dtype('f8'))


@pytest.mark.parametrize('name,obj,fmt,expect', [
    ('dtype', {'x': CraftedDtype(0x3F)}, 'zip', "'<f8' (flags 0x3f)"),
    ('array in a list', {'x': [CraftedArray(0x01)]}, 'zip', "'<f8' (flags 0x1)"),
    ('array in a tuple, legacy format', {'x': (CraftedArray(0x01), )}, 'legacy',
     "'<f8' (flags 0x1)"),
    ('list-pickled array', {'x': CraftedArray(0x02)}, 'zip', "'<f8' (flags 0x2)"),
    ('message hub history', {'hub': history_buffer_holding(CraftedArray(0x01))}, 'zip',
     "'<f8' (flags 0x1)"),
    ('object array in Namespace', {'args': argparse.Namespace(a=np.array([1, 'a'], object))},
     'zip', "'|O' (flags 0x3f)"),
    ('object dtype in ConfigDict', {'cfg': ConfigDict(a=dict(b=np.dtype(object)))}, 'zip',
     "'|O' (flags 0x3f)"),
])
def test_numpy_object_dtypes_are_refused_before_numpy_sees_them(tmp_path, capfd, name, obj, fmt,
                                                                 expect):
    p = tmp_path / 'dtype.pth'
    torch.save({'state_dict': {'w': torch.ones(1)}, **obj}, p,
               _use_new_zipfile_serialization=fmt == 'zip')
    with pytest.raises(UnsafeCheckpointError) as e:
        load_checkpoint_file(p)
    msg = str(e.value)
    assert f'it holds a numpy dtype {expect} marked as holding Python objects' in msg, msg
    assert f'AMVIM_UNSAFE_LOAD={p}' in msg and '\n' not in msg
    assert 'Internal error' not in ''.join(capfd.readouterr())   # no array of it was freed


def test_numpy_values_of_training_files_still_load(tmp_path):
    buf = HistoryBuffer()
    buf.update(2.5)
    p = tmp_path / 'numpy.pth'
    torch.save({'state_dict': {'w': torch.ones(1)}, 'hub': buf,
                'args': argparse.Namespace(lr=np.float32(0.5), steps=np.arange(3, dtype=np.int64),
                                           mask=np.array([True, False]))}, p)
    ck = load_checkpoint_file(p)
    assert ck['hub'].current() == 2.5 and ck['args'].lr == np.float32(0.5)
    assert ck['args'].steps.tolist() == [0, 1, 2] and ck['args'].mask.tolist() == [True, False]


def test_loads_from_several_threads_at_once(tmp_path):
    """The allow-list is torch's process-wide ``safe_globals`` state: loads from several threads
    (tools/demo.py exports checkpoints from a thread pool) must not end another thread's
    allow-list while it reads (seen: a training file refused as "needs more than the
    allow-list")."""
    import threading
    buf = HistoryBuffer()
    buf.update(1.0)
    paths = []
    for i in range(4):
        p = tmp_path / f'train{i}.pth'
        torch.save({'state_dict': {'w': torch.ones(64)}, 'hub': buf,
                    'args': argparse.Namespace(lr=np.float32(0.5))}, p)
        paths.append(p)
    errors, start = [], threading.Barrier(4)

    def load(p):
        start.wait()
        for _ in range(25):
            try:
                load_checkpoint_file(p)
            except Exception as e:   # noqa: BLE001
                errors.append(f'{type(e).__name__}: {e}')
    threads = [threading.Thread(target=load, args=(p, )) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
