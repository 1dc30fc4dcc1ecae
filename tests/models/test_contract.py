"""The contract every registered backbone x every registered reducer keeps (timm style: one
parametrised test over the registries). A new backbone or reducer is covered automatically; a
new reducer needs an entry in SCHEDULES (its protocol), or this test fails and says so."""
import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.models.skeleton.base import MambaBackbone
from amvim_mm.models.vim.family import VimFamilyBackbone
from amvim_mm.models.layout import ScanContext
from amvim_mm.models.reduction import TOKEN_REDUCERS
from amvim_mm.registry import MODELS

#: per reducer: a schedule that removes tokens, and one that removes none (must be identical)
SCHEDULES = {
    'ToMe': (dict(ratio=0.27), dict(ratio=0.0)),
    'RandomPrune': (dict(ratio=0.27, seed=0), dict(ratio=0.0, seed=0)),
    'ToP': (dict(keep_rate=0.7, locations=(1, )), dict(keep_rate=1.0, locations=(1, ))),
    'EViT': (dict(keep_rate=0.7, locations=(1, )), dict(keep_rate=1.0, locations=(1, ))),
    'DynamicViT': (dict(keep_rate=0.7, locations=(1, )), dict(keep_rate=1.0, locations=(1, ))),
    # LTMP removing nothing: no merging, and pruning only a token of importance exactly 0
    # (a token's importance is a sum of ReLUs over all channels: never 0 here)
    'LTMP': (dict(merge_init=0.3, prune_init=0.8), dict(merge=False, prune_init=0.0)),
}
BACKBONES = sorted(n for n, c in MODELS.module_dict.items()
                   if isinstance(c, type) and issubclass(c, VimFamilyBackbone))
#: hierarchical backbones: reduction inside one stage (the schedules count that stage's blocks)
HIERARCHICAL = {'VMamba': dict(arch='test', reduction_stage=2)}
HIER_SCHEDULES = {
    'ToMe': (dict(ratio=0.27), dict(ratio=0.0)),
    'RandomPrune': (dict(ratio=0.27, seed=0), dict(ratio=0.0, seed=0)),
    'ToP': (dict(keep_rate=0.7, locations=(0, )), dict(keep_rate=1.0, locations=(0, ))),
    'EViT': (dict(keep_rate=0.7, locations=(0, )), dict(keep_rate=1.0, locations=(0, ))),
    'DynamicViT': (dict(keep_rate=0.7, locations=(0, )), dict(keep_rate=1.0, locations=(0, ))),
    'LTMP': (dict(merge_init=0.3, prune_init=0.8), dict(merge=False, prune_init=0.0)),
}
#: plain backbones without a class token (one stream, the Vim schedules over their layers)
PLAIN = {'PlainMamba': dict(arch='test'), 'ViL': dict(arch='test', img_size=64),
         'AMViL': dict(arch='test', img_size=64)}
REDUCERS = sorted(TOKEN_REDUCERS.module_dict)
#: learned reducers: trained with each backbone's masked forward (pruning reducers everywhere;
#: merging ones on the Vim family only)
LEARNED = {n for n in REDUCERS if getattr(TOKEN_REDUCERS.get(n), 'learned', False)}


def test_registries_are_covered():
    assert {'Vim', 'AMVim', 'LocalVim'} <= set(BACKBONES)
    missing = set(REDUCERS) - set(SCHEDULES)
    assert not missing, f'add the protocol of {sorted(missing)} to SCHEDULES'
    missing = set(REDUCERS) - set(HIER_SCHEDULES)
    assert not missing, f'add the protocol of {sorted(missing)} to HIER_SCHEDULES'
    # every backbone that takes a reducer is in one of the two parametrised tests below
    reducible = {n for n, c in MODELS.module_dict.items()
                 if isinstance(c, type) and hasattr(c, 'set_token_reduction')}
    assert reducible == set(BACKBONES) | set(HIERARCHICAL) | set(PLAIN), reducible


def _assert_unreduced(reducer, outs, refs):
    """A schedule that removes nothing gives exactly the unreduced outputs (a reducer whose
    counts depend on the image runs image by image: a batch of 1 rounds its GEMMs differently
    from a batch of 2)."""
    for a, b in zip(outs, refs, strict=True):
        if getattr(TOKEN_REDUCERS.get(reducer), 'dynamic', False):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(a, b)


def _build(typ, out_type, reduction=None):
    torch.manual_seed(0)
    return MODELS.build(dict(type=typ, arch='test', img_size=64, out_type=out_type,
                             out_indices=(1, 3), token_reduction=reduction)).eval()


@pytest.mark.parametrize('reducer', REDUCERS)
@pytest.mark.parametrize('typ', BACKBONES)
def test_backbone_x_reducer(typ, reducer):
    on, off = SCHEDULES[reducer]
    x = torch.randn(2, 3, 64, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        # dense: the full grid comes back, whatever was removed
        plain = _build(typ, 'featmap')
        ref = plain(x)
        reduced = _build(typ, 'featmap', dict(type=reducer, **on))
        out = reduced(x)
        assert [o.shape for o in out] == [(2, 32, 4, 3)] * 2
        assert all(torch.isfinite(o).all() for o in out)
        assert reduced.token_counts[-1] < reduced.token_counts[0]
        # a schedule that removes nothing is exactly no reduction
        same = _build(typ, 'featmap', dict(type=reducer, **off))(x)
        _assert_unreduced(reducer, same, ref)
        # classification output: one vector per image
        cls = _build(typ, 'cls_token', dict(type=reducer, **on))(x)
        assert [o.shape for o in cls] == [(2, 32)] * 2
    if reducer in LEARNED:   # the masked training forward: same outputs, full length
        reduced.train()
        out = reduced(x)
        assert [o.shape for o in out] == [(2, 32, 4, 3)] * 2
        assert reduced.token_counts[-1] == reduced.token_counts[0]
        assert reduced.keep_mask.sum(1).max() < reduced.token_counts[0]


@pytest.mark.parametrize('reducer', REDUCERS)
@pytest.mark.parametrize('typ', sorted(HIERARCHICAL))
def test_hierarchical_backbone_x_reducer(typ, reducer):
    on, off = HIER_SCHEDULES[reducer]
    x = torch.randn(2, 3, 128, 96, generator=torch.Generator().manual_seed(1))

    def build(reduction=None, **kw):
        torch.manual_seed(0)
        return MODELS.build(dict(type=typ, **HIERARCHICAL[typ], token_reduction=reduction,
                                 **kw)).eval()

    with torch.no_grad():
        plain = build()
        ref = plain(x)
        reduced = build(dict(type=reducer, **on))
        out = reduced(x)
        # dense: four full maps whatever was removed; the reduced stage saw fewer tokens
        assert [o.shape for o in out] == [o.shape for o in ref]
        assert all(torch.isfinite(o).all() for o in out)
        stage = HIERARCHICAL[typ]['reduction_stage']
        assert torch.equal(out[stage - 1], ref[stage - 1])
        blocks = slice(2, 4)                # the 'test' arch: depths (1, 1, 2, 1)
        assert min(reduced.token_counts[blocks]) < min(plain.token_counts[blocks]) == 48
        assert reduced.token_counts[:2] == plain.token_counts[:2]
        same = build(dict(type=reducer, **off))(x)
        _assert_unreduced(reducer, same, ref)
        cls = build(dict(type=reducer, **on), out_type='avg_featmap', out_indices=(3, ))(x)
        assert [o.shape for o in cls] == [(2, 128)]
    if reducer in LEARNED and not getattr(TOKEN_REDUCERS.get(reducer), 'merges', False):
        reduced.train()                      # the masked training forward (pruning reducers)
        out = reduced(x)
        assert [o.shape for o in out] == [o.shape for o in ref]
        assert reduced.keep_mask.sum(1).max() < 48


@pytest.mark.parametrize('reducer', REDUCERS)
@pytest.mark.parametrize('typ', sorted(PLAIN))
def test_plain_backbone_x_reducer(typ, reducer):
    on, off = SCHEDULES[reducer]
    x = torch.randn(2, 3, 64, 48, generator=torch.Generator().manual_seed(1))

    def build(reduction=None, **kw):
        torch.manual_seed(0)
        return MODELS.build(dict(type=typ, **PLAIN[typ], token_reduction=reduction,
                                 **dict(dict(out_indices=(1, 3)), **kw))).eval()

    with torch.no_grad():
        ref = build()(x)
        reduced = build(dict(type=reducer, **on))
        out = reduced(x)
        assert [o.shape for o in out] == [(2, 32, 4, 3)] * 2
        assert all(torch.isfinite(o).all() for o in out)
        assert reduced.token_counts[-1] < reduced.token_counts[0]
        assert not torch.equal(out[1], ref[1])
        same = build(dict(type=reducer, **off))(x)
        _assert_unreduced(reducer, same, ref)
        cls = build(dict(type=reducer, **on), out_type='avg_featmap', out_indices=-1)(x)
        assert [o.shape for o in cls] == [(2, 32)]
    if reducer in LEARNED and not getattr(TOKEN_REDUCERS.get(reducer), 'merges', False):
        reduced.train()                      # the masked training forward (pruning reducers)
        out = reduced(x)
        assert [o.shape for o in out] == [(2, 32, 4, 3)] * 2
        assert reduced.keep_mask.sum(1).max() < reduced.token_counts[0]


#: every backbone on the skeleton (skeleton/base.py): one record, the same for every family
FAMILIES = sorted(n for n, c in MODELS.module_dict.items()
                  if isinstance(c, type) and issubclass(c, MambaBackbone))


@pytest.mark.parametrize('typ', FAMILIES)
@pytest.mark.parametrize('reduce', [False, True], ids=['plain', 'tome'])
def test_every_family_records_its_forward_the_same_way(typ, reduce):
    """After an eval forward, with or without a reducer: ``last_context`` is the context of
    the stage the reducer acts in (the full grid of ``reduction_domain``), ``token_counts``
    one count per block, no keep mask; ``final_stream`` (when asked for) the last stream."""
    red = dict(type='ToMe', ratio=0.27) if reduce else None
    m = MODELS.build(dict(type=typ, arch='test', img_size=64, token_reduction=red)).eval()
    m.record_final_stream = True
    with torch.no_grad():
        m(torch.randn(2, 3, 64, 64))
    M, blocks = m.reduction_domain()
    ctx = m.last_context
    assert isinstance(ctx, ScanContext) and ctx.grid[0] * ctx.grid[1] == M
    assert ctx.reduced == reduce
    assert len(m.token_counts) == m.num_layers and m.keep_mask is None
    assert m.final_stream.dim() == 3 and m.final_stream.shape[0] == 2
