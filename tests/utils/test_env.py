"""tools/check_env.py reports versions and fails with a fix when the install is broken."""
import subprocess
import sys
from pathlib import Path

from amvim_mm.bench import environment
from amvim_mm.utils import env

ROOT = Path(__file__).resolve().parents[2]


def test_check_env_passes_and_reports():
    r = subprocess.run([sys.executable, str(ROOT / 'tools' / 'check_env.py'), '--routes'],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for key in ('torch', 'mmcv ops', 'mmengine', 'mmsegmentation', 'mmdet', 'mmpretrain',
                'timm', 'numpy', 'mamba-ssm kernel', 'scan backend'):
        assert key in r.stdout
    assert 'compiled' in r.stdout
    assert 'environment OK' in r.stdout
    # --routes (issue 53): the plan of a reduced Vim-T forward, equal blocks merged
    assert 'Vim-T, ToMe 0.27, 224x224, batch 1, cpu inference:' in r.stdout
    assert '  embed: ' in r.stdout and '  steps before blocks 0, 2, 4, ' in r.stdout
    assert any(ln.startswith('  blocks 0-23: add+norm ') for ln in r.stdout.splitlines())
    # every family's plan (issue 53): the other families' blocks and steps, named
    for head in ('VMamba (tiny)', 'PlainMamba (L1)', 'ViL (tiny)'):
        assert f'{head}, ToMe 0.27, 224x224, batch 1, cpu inference:' in r.stdout
    # ViL's cell on the compiled CPU kernel (issue 55) where the library is built, else the
    # PyTorch forms with the reason
    from amvim_mm.ops import cpu_ops
    want = ('mixer cpu (inference: the compiled CPU cell' if cpu_ops.status()[0]
            else 'mixer torch (not CUDA')
    assert any(ln.startswith('  blocks 0-11: ') and want in ln for ln in r.stdout.splitlines())


def test_route_report_merges_equal_blocks_and_steps():
    from amvim_mm.bench.routes import _merge_blocks, _merge_steps
    assert _merge_steps(['step before block 0: a', 'step before block 2: a',
                         'step before block 4: b']) == ['steps before blocks 0, 2: a',
                                                        'step before block 4: b']
    lines = ['embed: torch (x)', 'block 0: a', 'block 1: a', 'block 2: b', 'block 3: a',
             'step before block 2: s']
    assert _merge_blocks(lines) == ['embed: torch (x)', 'blocks 0-1: a', 'block 2: b',
                                    'block 3: a', 'step before block 2: s']


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


def _checkout(root, requirements, mmcv='2.1.0'):
    """A source tree with only the files that hold the pins."""
    (root / 'tools').mkdir(parents=True)
    (root / 'requirements.txt').write_text(requirements)
    (root / 'tools' / 'setup_env.sh').write_text(f'set -euo pipefail\nMMCV_VERSION={mmcv}\n')
    return root


def test_the_pins_are_read_from_the_requirement_files(tmp_path):
    """A pin changed in the requirement files is what the check expects (no second copy)."""
    installed = env._version('mmengine')
    real = (ROOT / 'requirements.txt').read_text()
    assert f'\nmmengine=={installed}\n' in real
    pins = env.read_pins(ROOT)
    assert pins['mmengine'] == installed and pins['mmcv'] == env._version('mmcv')
    root = _checkout(tmp_path / 'a', real.replace(f'\nmmengine=={installed}\n',
                                                  '\nmmengine==9.9.9\n'))
    info, problems = env.collect_env(root=root)
    assert env.read_pins(root)['mmengine'] == '9.9.9'
    assert any(f'mmengine {installed} is installed but 9.9.9 is pinned' in p for p in problems)
    assert info['version pins'].startswith('requirements.txt')
    # mmcv is pinned where it is built: tools/setup_env.sh's MMCV_VERSION
    root = _checkout(tmp_path / 'b', real, mmcv='9.8.7')
    _, problems = env.collect_env(root=root)
    assert [p for p in problems if 'is pinned' in p] == [
        f'mmcv {env._version("mmcv")} is installed but 9.8.7 is pinned; {env.FIX}']


def test_without_the_requirement_files_the_pins_are_not_checked(tmp_path, monkeypatch):
    """An installed package without its source tree: one line says so, nothing crashes."""
    real = env._version
    monkeypatch.setattr(env, '_version', lambda d: '0.9.0' if d == 'mmengine' else real(d))
    assert env.read_pins(tmp_path) is None
    info, problems = env.collect_env(root=tmp_path)
    assert info['version pins'] == (f'not checked: no requirements.txt in {tmp_path} (an '
                                    'installed package without its source tree)')
    assert info['mmengine'] == '0.9.0' and not any('is pinned' in p for p in problems)
