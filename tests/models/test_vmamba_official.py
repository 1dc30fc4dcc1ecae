"""VMamba equals the official model: our backbone against an independent re-statement of the
official forward (``tests/reference/official_vmamba.py``, itself checked against the official
code run on CPU to 3e-6), on official-format checkpoints with random weights."""
import pytest
import torch

import amvim_mm  # noqa: F401
from amvim_mm.models.vmamba.ss2d import SS2D_DIRECTIONS
from amvim_mm.models.layout.scan_context import ScanContext
from amvim_mm.ops.cross_scan import cross_merge
from amvim_mm.registry import MODELS
from amvim_mm.token_layout import NO_CLS
from tests.reference import official_vmamba as ref

#: our arch name -> the reference's
ARCHS = {'tiny': 'tiny_s1l8', 'small': 'small_s2l15', 'base': 'base_s2l15',
         'vanilla-tiny': 'vanilla_tiny'}
# a wider step-size range than the official init, so that the scan's contribution to the
# outputs is large enough for a scan bug to show (see randomize_official_state_dict)
DT_RANGE = (1e-2, 1.0)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope='module')
def official_files(tmp_path_factory):
    root = tmp_path_factory.mktemp('vssm')
    files = {}
    for ours, theirs in ARCHS.items():
        sd = ref.random_official_state_dict(theirs, num_classes=1000, seed=0,
                                            dt_range=DT_RANGE)
        path = root / f'{theirs}.pth'
        torch.save(dict(model=sd), path)   # plain tensors: loads with weights_only=True
        files[ours] = (str(path), sd)
    return files


# every arch at a non-square input; 224 for tiny (CPU time)
CASES = [(a, (128, 96)) for a in ARCHS] + [('tiny', (224, 224))]


@pytest.mark.parametrize('arch,size', CASES, ids=[f'{a}-{h}x{w}' for a, (h, w) in CASES])
def test_dense_maps_and_logits_equal_the_official_model(arch, size, official_files):
    """A batch of two for tiny at 128x96 (samples kept apart: the same code in every arch),
    one image elsewhere (CPU time: base is the largest model of the suite)."""
    path, sd = official_files[arch]
    torch.manual_seed(1)
    x = torch.randn(2 if (arch, size) == ('tiny', (128, 96)) else 1, 3, *size)
    # the contract: no key but arch, out_indices and init_cfg
    dense = MODELS.build(dict(type='VMamba', arch=arch, out_indices=(0, 1, 2, 3),
                              init_cfg=dict(type='Pretrained', checkpoint=path)))
    dense.init_weights()
    cls = MODELS.build(dict(type='VMamba', arch=arch, out_type='avg_featmap', out_indices=(3, ),
                            init_cfg=dict(type='Pretrained', checkpoint=path)))
    cls.init_weights()
    with torch.no_grad():
        logits_ref, maps_ref = ref.official_vmamba_forward(sd, x, return_dense=True)
        maps = dense.eval()(x)
        feat = cls.eval()(x)[0]
        logits = torch.nn.functional.linear(feat, sd['classifier.head.weight'],
                                            sd['classifier.head.bias'])
    assert isinstance(maps, tuple) and len(maps) == 4
    for i, (a, b) in enumerate(zip(maps, maps_ref, strict=True)):
        assert a.shape == b.shape, i
        assert _rel(a, b) < 1e-5, (i, _rel(a, b))
    assert _rel(logits, logits_ref) < 1e-5


def test_contract_shapes_from_the_official_file(official_files):
    path, _ = official_files['tiny']
    m = MODELS.build(dict(type='VMamba', arch='tiny', out_indices=(0, 1, 2, 3),
                          init_cfg=dict(type='Pretrained', checkpoint=path)))
    m.init_weights()
    with torch.no_grad():
        out = m.eval()(torch.randn(2, 3, 128, 96))
    assert [tuple(o.shape) for o in out] == [(2, 96, 32, 24), (2, 192, 16, 12), (2, 384, 8, 6),
                                             (2, 768, 4, 3)]


@pytest.mark.parametrize('arch', ['tiny', 'vanilla-tiny'])
def test_ss2d_cross_merge_is_a_sum_in_float64(arch):
    """Before ``out_norm`` (which hides the scale of the merge): the four directions mapped
    back and summed, in float64, to 1e-12."""
    theirs = ARCHS[arch]
    sd = ref.random_official_state_dict(theirs, num_classes=10, seed=3, dt_range=DT_RANGE)
    m = MODELS.build(dict(type='VMamba', arch=arch, out_type='avg_featmap', out_indices=(3, )))
    m.load_state_dict({k: v for k, v in sd.items() if not k.startswith('classifier.head')})
    op = m.layers[1].blocks[0].op.double()
    p = 'layers.1.blocks.0.op.'
    sd64 = {k: v.double() for k, v in sd.items()}
    H, W = 5, 7
    xi = torch.randn(2, op.d_inner, H, W, dtype=torch.float64)      # after the conv + SiLU
    want = ref.ss2d_scan_merge(sd64, p, xi)                         # (B, E, H, W)
    ctx = ScanContext((H, W), cls_index=NO_CLS)
    tokens = xi.flatten(2).transpose(1, 2)
    # the official directions computed in place, and given as an index (a reduced sequence's
    # route, here with every cell present)
    for paths in (SS2D_DIRECTIONS, list(SS2D_DIRECTIONS)):
        with torch.no_grad():
            ys, index = op.directions(tokens, ctx, paths)
            got = cross_merge(ys, H, W, index)                              # (B, L, E)
        got = got.transpose(1, 2).reshape(want.shape)
        assert float((got - want).abs().max()) < 1e-12 * float(want.abs().max())
    # the whole mixer (in_proj, conv, out_norm, gate, out_proj) on a (d, H, W) map
    x = torch.randn(2, op.d_model, H, W, dtype=torch.float64)
    want = ref.ss2d(sd64, p, x, forward_type=op.forward_type)
    with torch.no_grad():
        got = op(x.flatten(2).transpose(1, 2), ctx).transpose(1, 2).reshape(want.shape)
    assert float((got - want).abs().max()) < 1e-12 * float(want.abs().max())


# ------------------------------------------------------------------ the three tasks' configs
TASK_CONFIGS = ['vmamba-t_upernet_4xb4-160k_ade20k-512x512.py',
                'vmamba-t_fpn_mask-rcnn_8xb2-1x_coco-1333x800.py',
                'vmamba-t_linear_8xb128-300e_in1k-224.py']


def _config_model(name, checkpoint):
    import importlib
    import os.path as osp

    from mmengine.registry import DefaultScope

    from amvim_mm.apis.runner import load_config
    root = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    cfg = load_config(osp.join(root, 'configs', 'vmamba', name))
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=checkpoint)
    scope = cfg.default_scope
    with DefaultScope.overwrite_default_scope(scope):
        return importlib.import_module(f'{scope}.registry').MODELS.build(cfg.model), scope


@pytest.mark.parametrize('name', TASK_CONFIGS)
def test_official_file_loads_strictly_in_every_task_config(name, official_files):
    """The shipped configs (VMamba-T) load an official file through their backbone's
    ``init_cfg=dict(type='Pretrained', ...)``: every backbone tensor of the file arrives."""
    path, sd = official_files['tiny']
    model, scope = _config_model(name, path)
    model.init_weights()
    own = model.backbone.state_dict()
    keys = [k for k in sd if not k.startswith('classifier.')]
    assert keys and all(torch.equal(own[k], sd[k]) for k in keys)
    if scope == 'mmpretrain':     # the classifier input norm comes from the file too
        assert torch.equal(own['classifier.norm.weight'], sd['classifier.norm.weight'])
    else:
        assert not any(k.startswith('classifier') for k in own)
        assert torch.equal(own['outnorm2.weight'], torch.ones(384))


@pytest.mark.parametrize('bad', ['', 'pretrain/does-not-exist.pth'])
def test_empty_or_missing_pretrained_in_a_config_fails_clearly(bad):
    """The official configs' ``pretrained=""`` trains from random weights without a word;
    here the same mistake stops the run with the reason."""
    from amvim_mm.errors import AmvimError
    model, _ = _config_model(TASK_CONFIGS[0], bad)
    with pytest.raises((AmvimError, FileNotFoundError),
                       match='needs "checkpoint"' if not bad else 'does-not-exist'):
        model.init_weights()


def test_whole_model_load_of_an_official_file(official_files, tmp_path):
    """mmengine's load_from (the libraries' tools/test.py) gets an official file: the
    classifier loads it completely, a segmentor refuses it (its heads would stay random)."""
    from mmengine.runner.checkpoint import _load_checkpoint, load_state_dict

    from amvim_mm.errors import CheckpointMismatchError
    path, sd = official_files['tiny']
    ck = _load_checkpoint(path, map_location='cpu')      # our registered loader converts it
    assert set(ck['state_dict']) == {'backbone.' + k for k in sd
                                     if not k.startswith('classifier.head')} | \
        {'head.fc.weight', 'head.fc.bias'}
    cls, _ = _config_model(TASK_CONFIGS[2], path)
    load_state_dict(cls, ck['state_dict'], strict=True)
    assert torch.equal(cls.head.fc.weight, sd['classifier.head.weight'])
    seg, _ = _config_model(TASK_CONFIGS[0], path)
    with pytest.raises(CheckpointMismatchError, match="classifier's"):
        load_state_dict(seg, ck['state_dict'], strict=False)
