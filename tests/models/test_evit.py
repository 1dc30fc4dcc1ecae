"""EViT's fused token is read: it opens every scan path, and a Vim with EViT equals an
independent statement of the rule (:mod:`tests.reference.evit_vim`)."""
import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.models.plain_mamba.plain_mamba import PlainMamba
from amvim_mm.models.plain_mamba.scan import SNAKE_DIRECTIONS
from amvim_mm.models.vmamba.ss2d import SS2D_DIRECTIONS
from amvim_mm.models.vmamba.vmamba import VMamba
from amvim_mm.registry import MODELS
from tests.reference.evit_vim import evit_vim_forward
from tests.reference.official_vim import random_official_state_dict

EVIT = dict(type='EViT', keep_rate=0.6, locations=(0, 1))


def _realistic(model, seed=0):
    """Weights of the scale a trained model has (the test archs' init makes the mixers'
    outputs tiny, so a token's influence on the others would be hard to see)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
    return model


def test_vim_evit_equals_the_independent_statement():
    model = MODELS.build(dict(type='Vim', arch='test', img_size=64, out_type='cls_token',
                              token_reduction=EVIT)).eval()
    sd = random_official_state_dict(model, seed=4)
    model.load_state_dict({k: v for k, v in sd.items() if not k.startswith('head')})
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours = model(x)[-1]
        ref = evit_vim_forward(sd, x, EVIT['keep_rate'], EVIT['locations'])
        model.set_token_reduction(dict(EVIT, type='ToP', align=False))
        pruned = model(x)[-1]
    assert model.token_counts[-1] == 5 + 1                 # 16 -> 9 -> 5 patches + class
    err = ((ours - ref).abs().max() / ref.abs().max()).item()
    assert err < 1e-5
    # the fused token changes the class token (it reads it): EViT is not pruning
    assert ((ours - pruned).abs().max() / ref.abs().max()).item() > 100 * max(err, 1e-7)


FAMILIES = [('Vim', {}), ('AMVim', {}), ('LocalVim', {}), ('PlainMamba', {}),
            ('VMamba', {}), ('ViL', {}), ('AMViL', {})]


@pytest.mark.parametrize('typ,extra', FAMILIES)
def test_fused_token_opens_every_path_and_changes_the_output(typ, extra):
    locations = (0, ) if typ == 'VMamba' else (0, 1)      # VMamba's test stage has 2 blocks
    cfg = dict(type=typ, arch='test', img_size=64, **extra)
    base = _realistic(MODELS.build(cfg).eval())
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    out = {}
    for name, red in (('evit', dict(type='EViT', keep_rate=0.6, locations=locations)),
                      ('top', dict(type='ToP', keep_rate=0.6, locations=locations,
                                   align=False))):
        m = MODELS.build(dict(cfg, token_reduction=red)).eval()
        m.load_state_dict(base.state_dict())
        with torch.no_grad():
            out[name] = m(x)
        if name == 'evit':
            ctx = m.last_record.context if hasattr(m, 'last_record') else m.last_context
            assert ctx.has_fused
            fused = int(ctx.pos.shape[1]) - 1
            assert (ctx.pos[:, fused] == -2).all()
            for spec in _paths(m):
                perm = ctx.path_index(spec).indices(ctx.pos)
                assert (perm[:, 0] == fused).all(), spec      # scanned first in every path
    scale = max(o.abs().max().item() for o in out['top'])
    diff = max((a - b).abs().max().item()
               for a, b in zip(out['evit'], out['top'], strict=True))
    assert diff > 1e-4 * scale, (typ, diff, scale)


def _paths(model):
    """The scan orders of the reduced blocks (``paths`` of the Vim and ViL blocks, the fixed
    directions of PlainMamba and SS2D, the ViL blocks' ``path``)."""
    if isinstance(model, PlainMamba):
        return list(SNAKE_DIRECTIONS)
    if isinstance(model, VMamba):
        return list(SS2D_DIRECTIONS)
    found = []
    for mod in model.modules():
        paths = getattr(mod, 'paths', None)
        if isinstance(paths, (list, tuple)) and paths and isinstance(paths[0], dict):
            return list(paths)
        if isinstance(getattr(mod, 'path', None), dict):          # ViL: one path per block
            found.append(mod.path)
    if found:
        return found
    raise AssertionError(f'{type(model).__name__}: no module with scan paths')
