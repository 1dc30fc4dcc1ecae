"""ERF maps, the FLOPs and scan-order tools (small, on CPU)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.analysis.erf import erf_map, high_contribution_area, normalise_erf
from amvim_mm.registry import MODELS

ROOT = Path(__file__).resolve().parents[1]
DEMO_CFG = ROOT / 'configs/demo/amvim-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py'


def run(*args, timeout=600):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_erf_map_shape_and_locality():
    torch.manual_seed(0)
    m = MODELS.build(dict(type='Vim', arch='test', img_size=64, out_type='cls_token'))
    e = erf_map(m, (64, 64), num_samples=2, batch_size=2)
    assert e.shape == (64, 64) and torch.isfinite(e).all() and e.sum() > 0
    n = normalise_erf(e)
    assert n.min() == 0 and n.max() == 1
    assert 0 < high_contribution_area(e) <= 1
    assert m.out_type == 'cls_token'        # restored afterwards


@pytest.mark.parametrize('family', ['Vim', 'AMVim', 'LocalVim', 'PlainMamba', 'ViL', 'AMViL'])
def test_erf_map_of_every_token_family(family):
    """Issue 52: ``tools/erf.py`` on ViL ended in "no attribute 'last_featmap'"; every family
    gives its last block's map (the weights perturbed: some families zero-initialise their
    output projections, which would give a zero map at construction)."""
    torch.manual_seed(0)
    m = MODELS.build(dict(type=family, arch='test', img_size=32))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    saved = m.out_type, list(m.out_indices)
    e = erf_map(m, (32, 32), num_samples=2, batch_size=2)
    assert e.shape == (32, 32) and torch.isfinite(e).all() and e.sum() > 0
    assert (m.out_type, list(m.out_indices)) == saved


def test_erf_map_of_vmamba_is_local_and_runs_with_reduction():
    """VMamba's last stage (stride 32; 128 px: a 4 x 4 grid, "centre" cell (2, 2) over
    pixels 64-95): the centre output's gradient reaches the image, more of it under that cell
    than in the far corner; also with stage-3 token reduction."""
    torch.manual_seed(0)
    for red in (None, dict(type='ToMe', ratio=0.3)):
        m = MODELS.build(dict(type='VMamba', arch='test', out_indices=(1, ), token_reduction=red))
        e = erf_map(m, (128, 128), num_samples=2, batch_size=2)
        assert e.shape == (128, 128) and torch.isfinite(e).all() and e.sum() > 0
        assert e[64:96, 64:96].mean() > e[:16, :16].mean()
        assert m.out_indices == [1]


def test_erf_tool_on_a_config_and_checkpoint(tmp_path):
    from mmengine.registry import DefaultScope

    from amvim_mm.apis.runner import load_config
    cfg = load_config(str(DEMO_CFG))
    import mmseg.registry
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = mmseg.registry.MODELS.build(cfg.model)
    ck = tmp_path / 'demo.pth'
    torch.save({'state_dict': model.state_dict()}, ck)
    out = tmp_path / 'erf.png'
    r = run('tools/erf.py', DEMO_CFG, ck, '--size', 64, '--samples', 2, '--out', out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'high-contribution area' in r.stdout
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    r = run('tools/erf.py', DEMO_CFG, tmp_path / 'missing.pth')
    assert r.returncode == 2 and 'checkpoint file not found' in r.stderr


def test_get_flops_tool():
    r = run('tools/get_flops.py', '--arch', 'tiny', '--ratios', '0', '0.46')
    assert r.returncode == 0, r.stderr
    assert '| ToMe | 0.46 | 0.464 | 29 |' in r.stdout and 'convention' in r.stdout
    r = run('tools/get_flops.py', '--arch', 'huge')
    assert r.returncode == 2 and "unknown Vim arch 'huge'" in r.stderr


def test_draw_scan_orders_draws_amvil_windows(tmp_path):
    """AMViL's traversals are drawn from its blocks: the top-left raster order and AMVim's
    windowed order in place of the flip."""
    out = tmp_path / 'amvil.png'
    r = run('tools/draw_scan_orders.py', '--model', 'AMViL', '--grid', 6, 6, '--out', out)
    assert r.returncode == 0 and out.stat().st_size > 0, r.stderr
    assert 'raster' in r.stdout and 'window' in r.stdout, r.stdout


def test_draw_scan_orders_tool(tmp_path):
    out = tmp_path / 'o.png'
    r = run('tools/draw_scan_orders.py', '--model', 'AMVim', '--grid', 5, 7, '--out', out,
            '--cfg-options', 'window_size=2')
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:4] == b'\x89PNG'
    r = run('tools/draw_scan_orders.py', '--model', 'AMVim', '--cfg-options', 'window_size=0')
    assert r.returncode == 2 and 'window size must be a positive int' in r.stderr


def test_count_params_tool(tmp_path):
    """tools/count_params.py builds a config's model and prints its parameters (PlainMamba-L1
    classifier: 7.55M, backbone 7.36M, as published); a missing config is a one-line error."""
    r = run('tools/count_params.py',
            'configs/plainmamba/plainmamba-l1_linear_8xb256-300e_in1k-224.py')
    assert r.returncode == 0, r.stderr[-2000:]
    assert '| configs/plainmamba/plainmamba-l1_linear_8xb256-300e_in1k-224.py | 7.55 | 7.36 |' \
        in r.stdout
    r = run('tools/count_params.py', tmp_path / 'missing.py')
    assert r.returncode == 2 and 'error:' in r.stderr and 'Traceback' not in r.stderr
