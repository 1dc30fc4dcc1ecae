"""tools/check_env.py reports versions and fails with a fix when the install is broken."""
import subprocess
import sys
from pathlib import Path

from amvim_mm.bench import environment
from amvim_mm.utils import env

ROOT = Path(__file__).resolve().parents[2]


def test_check_env_passes_and_reports():
    r = subprocess.run([sys.executable, str(ROOT / 'tools' / 'check_env.py')],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for key in ('torch', 'mmcv ops', 'mmengine', 'mmsegmentation', 'mmdet', 'mmpretrain',
                'timm', 'numpy', 'mamba-ssm kernel', 'scan backend'):
        assert key in r.stdout
    assert 'compiled' in r.stdout
    assert 'environment OK' in r.stdout


def test_check_env_names_a_broken_install(monkeypatch):
    real = env._version
    monkeypatch.setattr(env, '_version',
                        lambda d: '0.9.0' if d == 'mmengine' else real(d))
    _, problems = env.collect_env()
    assert any('mmengine 0.9.0 is installed but 0.10.7 is pinned' in p and 'setup_env.sh' in p
               for p in problems)


def test_bad_backend_env_is_a_problem(monkeypatch):
    monkeypatch.setenv('AMVIM_SCAN_BACKEND', 'fast')
    _, problems = environment.collect_env()
    assert any("unknown scan backend 'fast'" in p for p in problems)


def test_bad_fused_env_is_a_problem(monkeypatch):
    monkeypatch.setenv('AMVIM_FUSED_MIXER', 'maybe')
    info, problems = environment.collect_env()
    assert any("AMVIM_FUSED_MIXER='maybe'" in p for p in problems)
    monkeypatch.setenv('AMVIM_FUSED_MIXER', '0')
    info, problems = environment.collect_env()
    assert info['fused mixer (inference)'].startswith('off')


def test_forced_backends_this_machine_lacks_are_problems(monkeypatch):
    """check_env must not say "environment OK" when every run would then fail."""
    import torch

    from amvim_mm.ops.backends import mamba_selective_scan
    from amvim_mm.ops.fused_mixer import fused_mixer_available
    monkeypatch.setenv('AMVIM_SCAN_BACKEND', 'cuda')
    _, problems = environment.collect_env()
    usable = torch.cuda.is_available() and mamba_selective_scan()[0] is not None
    assert any('AMVIM_SCAN_BACKEND=cuda' in p for p in problems) != usable
    monkeypatch.delenv('AMVIM_SCAN_BACKEND')
    monkeypatch.setenv('AMVIM_FUSED_MIXER', '1')
    _, problems = environment.collect_env()
    assert any('AMVIM_FUSED_MIXER=1' in p for p in problems) != fused_mixer_available('cuda')[0]


def test_retired_trust_variables_are_problems(monkeypatch):
    monkeypatch.setenv('AMVIM_TRUSTED_DIRS', '.')
    _, problems = env.collect_env()
    assert any('AMVIM_TRUSTED_DIRS is set but no longer honoured' in p for p in problems)
