"""Identity (d) of the exact scan masks: the mixer's masked training forward (every path scans
each sample's kept tokens first, in inference's order; a different kept count per sample)
equals, at the kept tokens, the mixer on the physically pruned sequence (inference), for the
Vim-family mixers with their causal conv and both scan paths, in float64."""
import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.errors import ConfigError
from amvim_mm.models.layout import ScanContext
from amvim_mm.models.layout.scan_orders import masked_path_permutation, path_permutation
from amvim_mm.models.layout.scan_orders import scan_rank
from amvim_mm.models.reduction.state import init_reduction_state, reduce_tokens
from amvim_mm.registry import MODELS


def _model(typ):
    torch.manual_seed(0)
    m = MODELS.build(dict(type=typ, arch='test', img_size=64, fused_mixer=False))
    return m.double().eval()


def _keep(B, L, cls_index, seed=0):
    """(B, L) float keep masks with a different number of kept patches per sample."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.ones(B, L, dtype=torch.float64)
    for b in range(B):
        n_drop = 3 + 4 * b
        cand = [i for i in range(L) if i != cls_index]
        drop = torch.tensor(cand)[torch.randperm(len(cand), generator=g)[:n_drop]]
        keep[b, drop] = 0
    return keep


@pytest.mark.parametrize('typ', ['Vim', 'AMVim', 'LocalVim'])
@pytest.mark.parametrize('with_cls', [True, False])
def test_masked_mixer_equals_pruned_inference(typ, with_cls):
    m = _model(typ)
    block = m.layers[1]
    grid = m.patch_resolution
    M = grid[0] * grid[1]
    cls_index = M // 2 if with_cls else -1
    ctx = ScanContext(grid, cls_index=cls_index)
    L = M + int(with_cls)
    B = 3
    x = torch.randn(B, L, m.embed_dims, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1))
    keep = _keep(B, L, cls_index)
    with torch.no_grad():
        got = block.mixer.forward_masked(x, ctx, block.path_keys, keep)
    assert bool((got[keep == 0] == 0).all())
    for b in range(B):
        # inference: sample b alone, its dropped tokens pruned
        red = init_reduction_state(ctx, 1, 'cpu')
        removed = (keep[b] == 0).nonzero().flatten()[None]
        xb, _, red = reduce_tokens(red, x[b:b + 1], None, removed, torch.full_like(removed, -1),
                                   merges=False)
        with torch.no_grad():
            want = block.mixer.forward_torch(xb, red, block.path_keys)
        # the kept tokens of the masked forward, in the reduced sequence's layout
        kept_patches = [i for i in range(L) if keep[b, i] == 1 and i != cls_index]
        order = kept_patches
        if with_cls:
            n = len(kept_patches)
            order = kept_patches[:n // 2] + [cls_index] + kept_patches[n // 2:]
        assert (got[b, order] - want[0]).abs().max() <= 1e-10


def test_masked_permutation_matches_inference_order_and_puts_dropped_last():
    H, W = 4, 5
    M = H * W
    cls = M // 2
    pos = torch.cat([torch.arange(cls), torch.tensor([-1]), torch.arange(cls, M)])
    keep = _keep(2, M + 1, cls, seed=3) > 0.5
    for spec, rev in ((dict(order='raster'), True), (dict(order='column'), False),
                      (dict(order='snake', axis='col'), True)):
        rank = scan_rank(H, W, spec)
        perm = masked_path_permutation(rank, pos, keep, cls, rev)
        for b in range(2):
            n = int(keep[b].sum())
            sub = keep[b].nonzero().flatten()                     # kept tokens in sequence order
            n_patch = n - 1
            sub_pos = pos[sub]
            # inference's order of the survivors (class token at the middle slot)
            red_pos = torch.cat([sub_pos[sub_pos >= 0][:n_patch // 2], torch.tensor([-1]),
                                 sub_pos[sub_pos >= 0][n_patch // 2:]])
            inf = path_permutation(rank, red_pos, n_patch // 2, rev)
            red_seq = torch.cat([sub[sub != cls][:n_patch // 2], torch.tensor([cls]),
                                 sub[sub != cls][n_patch // 2:]])
            assert perm[b, :n].tolist() == red_seq[inf].tolist()
            assert set(perm[b, n:].tolist()) == set((~keep[b]).nonzero().flatten().tolist())


def test_masked_forward_gradient_reaches_the_mask_and_shapes_are_checked():
    m = _model('Vim').float()
    block = m.layers[0]
    grid = m.patch_resolution
    M = grid[0] * grid[1]
    ctx = ScanContext(grid, cls_index=M // 2)
    x = torch.randn(2, M + 1, m.embed_dims)
    keep = _keep(2, M + 1, M // 2).float().requires_grad_(True)
    block.mixer.forward_masked(x, ctx, block.path_keys, keep).square().sum().backward()
    assert keep.grad is not None and keep.grad.abs().sum() > 0
    with pytest.raises(ConfigError, match='keep must be'):
        block.mixer.forward_masked(x, ctx, block.path_keys, keep[:, :5])
