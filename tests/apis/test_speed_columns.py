"""prune_eval's speed columns (issue 54): the backbone alone, the whole model through the
library's test step, and the ceiling (the whole model with its backbone at the FLOPs ratio)."""
import pytest

from amvim_mm.apis.sweep.report import _speed_cells, ceiling_speedup


def test_the_ceiling_shrinks_only_the_backbone_share():
    # unreduced: backbone 10 ms/img of a 20 ms/img model; the cell's backbone FLOPs halved
    zero = dict(img_per_s=100.0, img_per_s_model=50.0, gflops=4.0)
    row = dict(img_per_s=180.0, img_per_s_model=80.0, gflops=2.0)
    assert ceiling_speedup(row, zero) == pytest.approx(0.020 / 0.015)
    assert ceiling_speedup(zero, zero) == pytest.approx(1.0)
    assert ceiling_speedup(row, dict(zero, img_per_s_model=None)) is None
    assert _speed_cells(row, zero) == ['180.0', '1.80x', '80.0', '1.60x', '1.33x']
    assert _speed_cells(dict(gflops=2.0), None) == ['', '', '', '', '']
