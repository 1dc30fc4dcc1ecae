"""amvim_mm.runtime: every AMVIM_* switch read in one module, with one parser, and a context
manager to change them in code."""
import pathlib
import re
import threading

import pytest

from amvim_mm import runtime
from amvim_mm.errors import ConfigError

PACKAGE = pathlib.Path(runtime.__file__).parent


def test_defaults_and_environment(monkeypatch):
    for _, (var, _) in runtime.VARIABLES.items():
        monkeypatch.delenv(var, raising=False)
    s = runtime.settings()
    assert s == runtime.Settings()
    monkeypatch.setenv('AMVIM_SCAN_BACKEND', 'Torch')
    monkeypatch.setenv('AMVIM_FUSED_MIXER', 'off')
    monkeypatch.setenv('AMVIM_TOME_MATCH_CONFIG', '32,8,1')
    s = runtime.settings()      # parsed again: a variable changed
    assert (s.scan_backend, s.fused_mixer, s.match_config) == ('torch', False, (32, 8, 1))


@pytest.mark.parametrize('var,value,message', [
    ('AMVIM_SCAN_BACKEND', 'fast', "unknown scan backend 'fast' (from AMVIM_SCAN_BACKEND)"),
    ('AMVIM_CONV_BACKEND', 'gpu', "unknown causal conv backend 'gpu'"),
    ('AMVIM_FUSED_MIXER', 'maybe', "AMVIM_FUSED_MIXER='maybe': use 1 (on), 0 (off) or auto"),
    ('AMVIM_FUSED_REDUCTION_KERNELS', 'sure', "AMVIM_FUSED_REDUCTION_KERNELS='sure'"),
    ('AMVIM_FUSED_SCAN_CONFIG', '16x2', 'expected "BLOCK_E,num_warps,dt_in_kernel"'),
    ('AMVIM_EMBED_CONFIG', '1,2,3', 'AMVIM_EMBED_CONFIG='),
])
def test_bad_values_name_the_variable(monkeypatch, var, value, message):
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as e:
        runtime.settings()
    assert message in str(e.value)


def test_override_nests_validates_and_restores(monkeypatch):
    monkeypatch.delenv('AMVIM_FUSED_MIXER', raising=False)
    monkeypatch.setenv('AMVIM_SCAN_BACKEND', 'reference')
    with runtime.override(fused_mixer=False, scan_backend='torch') as s:
        assert s is runtime.settings() and s.scan_backend == 'torch' and s.fused_mixer is False
        with runtime.override(scan_config='16,2,0'):
            assert runtime.settings().scan_config == (16, 2, 0)
            assert runtime.settings().scan_backend == 'torch'
        assert runtime.settings().scan_config is None
    assert runtime.settings().scan_backend == 'reference'
    with pytest.raises(ConfigError, match='unknown runtime settings'):
        with runtime.override(fused=True):
            pass
    with pytest.raises(ConfigError, match="unknown scan backend 'fast'"):
        with runtime.override(scan_backend='fast'):
            pass


def test_override_is_per_thread():
    seen = {}
    with runtime.override(reduction_kernels=False):
        t = threading.Thread(target=lambda: seen.update(v=runtime.settings().reduction_kernels))
        t.start()
        t.join()
        assert runtime.settings().reduction_kernels is False
    assert seen['v'] is runtime.from_environment().reduction_kernels


def test_no_other_module_reads_the_environment():
    """The switches are read in amvim_mm/runtime.py only."""
    offenders = []
    for path in PACKAGE.rglob('*.py'):
        if path.name == 'runtime.py':
            continue
        text = path.read_text()
        if re.search(r'os\.environ|os\.getenv|getenv\(', text):
            offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []


def test_pinned_reads_the_environment_once_for_the_block(monkeypatch):
    """``pinned`` (a backbone's forward) answers every ``settings()`` call inside it from one
    reading of the environment; an ``override`` inside still applies, an outer ``override``
    is kept, and after the block the environment is read again."""
    from amvim_mm import runtime
    monkeypatch.setenv('AMVIM_SCAN_BACKEND', 'torch')
    reads = []
    orig = runtime.from_environment
    monkeypatch.setattr(runtime, 'from_environment', lambda: reads.append(1) or orig())
    with runtime.pinned() as s:
        monkeypatch.setenv('AMVIM_SCAN_BACKEND', 'reference')
        assert [runtime.settings().scan_backend for _ in range(5)] == ['torch'] * 5
        with runtime.override(scan_backend='cpu'):
            assert runtime.settings().scan_backend == 'cpu'
        assert runtime.settings() is s
    assert len(reads) == 1
    assert runtime.settings().scan_backend == 'reference'
    with runtime.override(cpu_kernels=False), runtime.pinned() as s:
        assert s.cpu_kernels is False and s.scan_backend == 'reference'


def test_a_backbone_forward_reads_the_switches_once(monkeypatch):
    import torch

    from amvim_mm import runtime
    from amvim_mm.registry import MODELS
    m = MODELS.build(dict(type='Vim', arch='test', img_size=32,
                          token_reduction=dict(type='ToMe', ratio=0.3))).eval()
    reads = []
    orig = runtime.from_environment
    monkeypatch.setattr(runtime, 'from_environment', lambda: reads.append(1) or orig())
    with torch.no_grad():
        m(torch.randn(1, 3, 32, 32))
    assert len(reads) == 1
