"""ERF maps, the FLOPs and scan-order tools (small, on CPU)."""
import importlib.util
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
TOKENS_CFG = ROOT / 'configs/demo/vim-demo_segmenter-mask_1xb8-2k_toyshapes-64x64.py'


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


def _load_tool(name):
    spec = importlib.util.spec_from_file_location(f'_tool_{name}', ROOT / 'tools' / f'{name}.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table(text):
    """The header cells and the rows (cells) of the markdown table in ``text``."""
    rows = [[c.strip() for c in ln.strip().strip('|').split('|')]
            for ln in text.splitlines() if ln.startswith('|')]
    return rows[0], rows[2:]


def test_get_flops_splits_a_segmentor_config(tmp_path, capsys):
    """Issue 56: ``get_flops.py CONFIG`` prints backbone / neck / heads / total at the test
    crop; the inference parts add up to the total (the auxiliary head, absent here, is not
    added), and ToMe lowers the backbone only (UperNet runs on the restored grid)."""
    gf = _load_tool('get_flops')
    assert gf.main([str(DEMO_CFG), '--ratios', '0', '0.4']) == 0
    out = capsys.readouterr().out
    head, rows = _table(out)
    assert head[1:] == ['ratio', 'realised', 'backbone', 'neck', 'decode head',
                        'auxiliary head (train)', 'total']
    assert head[0].endswith('64x64 (test crop)') and 'convention' in out
    assert [r[:2] for r in rows] == [['none', '0.00'], ['ToMe', '0.40']]
    assert [r[6] for r in rows] == ['-', '-']
    values = [[float(c) for c in (*r[3:6], r[7])] for r in rows]
    for b, n, d, total in values:
        assert abs(b + n + d - total) <= 0.0015
    assert values[1][0] < values[0][0] and values[1][1:3] == values[0][1:3]
    # without --ratios: the reduction the config tests with (here its TokenReductionHook)
    hooked = tmp_path / 'hooked.py'
    hooked.write_text(f"_base_ = [{str(DEMO_CFG)!r}]\n"
                      "custom_hooks = [dict(type='TokenReductionHook', "
                      "reduction=dict(type='ToMe', ratio=0.4), phases=('test', ))]\n")
    assert gf.main([str(hooked)]) == 0
    _, hooked_rows = _table(capsys.readouterr().out)
    assert [r[:2] for r in hooked_rows] == [['ToMe (config)', '0.40']]
    assert hooked_rows[0][2:] == rows[1][2:]


def test_model_flops_backbone_part_is_the_backbone_count():
    """The backbone part is the backbone-only counter's number for the same backbone (each
    convention, each reducer); a head on the kept tokens (Segmenter, ``out_type='tokens'``)
    shrinks with the reduction, the parts always add up to ``inference``."""
    from amvim_mm.analysis.flops import backbone_flops
    from amvim_mm.analysis.model_flops import inference_shape, model_flops
    gf = _load_tool('get_flops')
    tome = dict(type='ToMe', ratio=0.4)
    model, cfg = gf.build_model(str(DEMO_CFG))
    assert inference_shape(model) == (64, 64)
    alone = MODELS.build(cfg.model.backbone)
    for red, convention in ((None, 'mamba'), (tome, 'mamba'), (tome, 'localmamba')):
        f = model_flops(model, (64, 64), red, convention)
        assert f['parts']['backbone'] == \
            backbone_flops(alone, (64, 64), red, convention=convention)['gflops']
        assert f['inference'] == pytest.approx(sum(f['parts'][k] for k in
                                                   ('backbone', 'neck', 'decode_head')))
    model, _ = gf.build_model(str(TOKENS_CFG))
    full, reduced = (model_flops(model, (64, 64), red) for red in (None, tome))
    assert full['parts']['neck'] is None and full['parts']['auxiliary_head'] is None
    assert reduced['parts']['backbone'] < full['parts']['backbone']
    assert reduced['parts']['decode_head'] < full['parts']['decode_head']
    assert full['inference'] == pytest.approx(full['parts']['backbone']
                                              + full['parts']['decode_head'])


def test_get_flops_config_errors(tmp_path, capsys):
    """A missing config, a config without a model, a classifier and a two-stage detector
    each end in one ``error:`` line and exit code 2."""
    from torch import nn

    from amvim_mm.analysis.model_flops import split_model
    from amvim_mm.apis.cli import run_cli
    from amvim_mm.errors import ConfigError
    gf = _load_tool('get_flops')
    no_model = tmp_path / 'no_model.py'
    no_model.write_text("default_scope = 'mmseg'\n")
    classifier = ROOT / 'configs/demo/vim-demo_linear_1xb8-2k_toyshapes-64x64.py'
    for argv, message in (([str(tmp_path / 'missing.py')], 'config file not found'),
                          ([str(no_model)], 'no model in the config'),
                          ([str(classifier)], 'ImageClassifier is no segmentor'),
                          (['--shape', '64', '64'], '--shape is for a CONFIG')):
        capsys.readouterr()
        assert run_cli(lambda: gf.main(argv)) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith('error: ') and message in err and err.count('\n') == 1, err

    class TwoStage(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.neck = nn.Identity(), nn.Identity()
            self.rpn_head, self.roi_head = nn.Identity(), nn.Identity()

    with pytest.raises(ConfigError, match='TwoStage is a two-stage detector'):
        split_model(TwoStage())


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
