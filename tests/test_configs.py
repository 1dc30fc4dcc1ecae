"""Every shipped config (``configs/*/*.py`` except ``_base_``) loads, builds and runs on a CPU.

Each config is loaded as the tools load it (``amvim_mm.apis.runner.load_config``, so its
``custom_imports`` run), shrunk to a CPU-sized model by plain edits of the config dict (the test
architecture, small images, matching neck/head widths, BN instead of SyncBN, no pretrained
weights), built from its own library's registry in its own default scope, and run forward once.
The list of configs is globbed, so a new config is covered without touching this file.

It also checks that the backbone is swappable by a one-line override within its family (the
plain Vim family; VMamba is hierarchical and PlainMamba plain with its own arguments, neither
has a sibling yet)::

    cfg.model.backbone.type = 'AMVim'   # or 'Vim', 'LocalVim'

and the file-name convention
``{backbone}_{neck}_{head}_{gpus}xb{batch}-{schedule}_{dataset}-{crop}[_tokenreduce].py``
(classification configs have no neck: ``vim-t_linear_8xb128-300e_in1k-224.py``; neither does
UperNet on a hierarchical backbone: ``vmamba-t_upernet_4xb4-160k_ade20k-512x512.py``, nor the
official PlainMamba UperNet: ``plainmamba-l1_upernet_8xb2-160k_ade20k-512x512.py``).
"""
import copy
import glob
import os.path as osp
import re
import uuid
from collections.abc import Sequence

import pytest
import torch
from mmengine.registry import DefaultScope

from amvim_mm.apis.runner import load_config
from amvim_mm.models.reduction import TOKEN_REDUCERS

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG_DIR = osp.join(ROOT, 'configs')
# configs/deploy/ holds deploy configs (mmdeploy's format, no model: tests/deploy/test_tools.py)
CONFIGS = sorted(c for c in glob.glob(osp.join(CONFIG_DIR, '*', '*.py'))
                 if osp.basename(osp.dirname(c)) not in ('_base_', 'deploy'))
IDS = [osp.relpath(c, CONFIG_DIR) for c in CONFIGS]

# backbone families: a config swaps its backbone by one line within its family only (a plain
# backbone's configs add a feature pyramid neck; a hierarchical one feeds its four stages to the
# head or FPN directly)
PLAIN_BACKBONES = ('Vim', 'AMVim', 'LocalVim')
HIERARCHICAL_BACKBONES = ('VMamba', )
# plain (one stride-16 map per output) but with its own arguments (arch 'l1'..'l3', no class
# token), so not swappable with the Vim family; its official UperNet takes four maps without a
# neck, our option adds PlainPyramidNeck
PLAIN_MAMBA_BACKBONES = ('PlainMamba', )
# Vision-LSTM: plain (stride-16 maps through the pyramid / SFP necks), its own arguments
VIL_BACKBONES = ('ViL', 'AMViL')
BACKBONES = PLAIN_BACKBONES + HIERARCHICAL_BACKBONES + PLAIN_MAMBA_BACKBONES + VIL_BACKBONES
FAMILIES = (PLAIN_BACKBONES, HIERARCHICAL_BACKBONES, PLAIN_MAMBA_BACKBONES, VIL_BACKBONES)
# constructor arguments that only one backbone type takes
TYPE_SPECIFIC_KEYS = {
    'AMVim': ('window_size', 'windowed_path', 'inner', 'seed', 'shift_odd_blocks', 'paths'),
    'LocalVim': ('directions', ),
}
TINY_ARCH = dict(embed_dims=32, num_layers=4, d_state=8)
TINY_VIL_ARCH = dict(embed_dims=32, num_layers=4)
TINY_DIMS = 32
# the hierarchical backbones' test architecture: C = 16, depths (1, 1, 2, 1)
TINY_HIER_DIMS = (16, 32, 64, 128)
TINY_HIER_LAYERS = 5
SEG_SIZE = 64
DET_SIZE = 128
CLS_SIZE = 64

# {backbone}_{neck}_{head}_{gpus}xb{batch}-{schedule}_{dataset}-{crop}[_official-code|_paper-text]
# [_tokenreduce|_dynamicvit|_ltmp].py (the recipe a dense config follows: what the official code
# ran, or the paper's text; the last two: a learned reducer's fine-tuning config); a backbone may
# name its version (vil-t-v1)
NAME_RE = re.compile(
    r'^(?P<backbone>(?:vim|amvim|localvim|vmamba|plainmamba|vil|amvil)-[a-z0-9]+(?:-v\d+)?)'
    r'(?:_(?P<neck>[a-z0-9]+(?:-[a-z0-9]+)*))?'
    r'_(?P<head>[a-z0-9]+(?:-[a-z0-9]+)*)'
    r'_(?P<gpus>\d+)xb(?P<batch>\d+)'
    r'-(?P<schedule>[a-z0-9]+(?:-[a-z0-9]+)*)'
    r'_(?P<dataset>[a-z0-9]+)'
    r'-(?P<crop>\d+(?:x\d+)?)'
    r'(?P<recipe>_official-code|_paper-text)?'
    r'(?P<suffix>_tokenreduce|_dynamicvit|_ltmp)?\.py$')

pytestmark = [
    pytest.mark.filterwarnings('ignore:``build_loss`` would be deprecated:UserWarning'),
    pytest.mark.filterwarnings('ignore:The ``clip_grad`` is deprecated:UserWarning'),
]


def test_configs_found():
    assert len(CONFIGS) >= 10, CONFIGS
    tasks = {NAME_RE.match(osp.basename(c))['dataset'] for c in CONFIGS}
    assert {'ade20k', 'coco', 'in1k'} <= tasks, tasks


# --------------------------------------------------------------------------------- helpers
def _load(path, tmp_path, unwrap=True):
    """The config; a learned reducer's fine-tuning config (``ReducerFineTuner``) with its
    student model as ``cfg.model`` (``unwrap``), the reducer's schedule fitted to the 4-block
    test architecture (the wrapper itself: ``test_finetuning_configs_build_the_wrapper``)."""
    cfg = load_config(path, work_dir=str(tmp_path / f'work_{uuid.uuid4().hex[:8]}'))
    wrapped = cfg.model.get('type') == 'ReducerFineTuner'
    inner = cfg.model.model if wrapped else cfg.model
    red = inner.backbone.get('token_reduction')
    if isinstance(red, dict) and red.get('type') == 'DynamicViT':
        red.locations = (0, 2)
    if unwrap and wrapped:
        cfg.model = inner
    return cfg


def _sync_bn_to_bn(obj):
    """Replace every ``dict(type='SyncBN', ...)`` by BN in place (single process, CPU)."""
    if isinstance(obj, dict):
        if obj.get('type') == 'SyncBN':
            obj['type'] = 'BN'
        for v in obj.values():
            _sync_bn_to_bn(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _sync_bn_to_bn(v)


def _num_out(out_indices):
    if isinstance(out_indices, Sequence) and not isinstance(out_indices, str):
        return len(out_indices)
    return 1


def shrink(cfg, arch=TINY_ARCH):
    """CPU-sized copy of ``cfg.model`` by plain dict edits (the same ones a user would make)."""
    if cfg.model.backbone.type in HIERARCHICAL_BACKBONES:
        return shrink_hierarchical(cfg)
    if cfg.model.backbone.type in PLAIN_MAMBA_BACKBONES:
        return shrink_plain_mamba(cfg)
    if cfg.model.backbone.type in VIL_BACKBONES and arch is TINY_ARCH:
        arch = TINY_VIL_ARCH
    scope = cfg.default_scope
    model = cfg.model
    bb = model.backbone
    n_out = _num_out(bb.get('out_indices', -1))
    assert 1 <= n_out <= 4, bb.get('out_indices')
    bb.arch = arch
    bb.init_cfg = None
    bb.out_indices = tuple(range(4 - n_out, 4))          # 4 -> (0, 1, 2, 3), 1 -> (3, )
    if scope == 'mmseg' and model.get('neck') is None:     # a head on the kept tokens
        bb.img_size = SEG_SIZE
        model.data_preprocessor.size = (SEG_SIZE, SEG_SIZE)
        head = model.decode_head
        head.update(in_channels=TINY_DIMS, channels=TINY_DIMS)
        if 'embed_dims' in head:
            head.update(embed_dims=16, num_heads=2)
        model.test_cfg = dict(mode='whole')
    elif scope == 'mmseg':
        bb.img_size = SEG_SIZE
        model.data_preprocessor.size = (SEG_SIZE, SEG_SIZE)
        model.neck.in_channels = TINY_DIMS
        model.decode_head.in_channels = [TINY_DIMS] * 4
        model.decode_head.channels = 16
        if model.get('auxiliary_head') is not None:
            model.auxiliary_head.in_channels = TINY_DIMS
            model.auxiliary_head.channels = 16
        model.test_cfg = dict(mode='whole')
    elif scope == 'mmdet':
        bb.img_size = DET_SIZE
        model.neck.in_channels = TINY_DIMS
        for aug in model.data_preprocessor.get('batch_augments') or []:
            if aug.get('type') == 'BatchFixedSizePad':
                aug.size = (DET_SIZE, DET_SIZE)
        # a square pad (the official Vim detector pads to 1024 x 1024) shrinks with the images
        if model.data_preprocessor.get('pad_size_divisor', 1) > DET_SIZE:
            model.data_preprocessor.pad_size_divisor = DET_SIZE
        _shrink_det_test_cfg(model)
    elif scope == 'mmpretrain':
        bb.img_size = CLS_SIZE
        # ViL v2's pooled features: the first and the last token side by side
        model.head.in_channels = TINY_DIMS * (2 if bb.get('out_type') == 'pooled' else 1)
    else:
        raise AssertionError(f'unexpected default_scope {scope!r}')
    _sync_bn_to_bn(model)
    return cfg


def _shrink_det_test_cfg(model):
    # fewer proposals/detections: the ROI heads dominate the CPU time otherwise
    if 'rpn' in model.test_cfg:
        model.test_cfg.rpn.update(nms_pre=100, max_per_img=50)
        model.test_cfg.rcnn.max_per_img = 10
    else:                                             # one-stage (the demo's RetinaNet)
        model.test_cfg.update(nms_pre=100, max_per_img=10)


def shrink_hierarchical(cfg):
    """``shrink`` for a hierarchical backbone (VMamba): the ``'test'`` architecture, whose
    stages have ``TINY_HIER_DIMS`` channels, feeds the head (UperNet, FPN, linear) directly."""
    scope = cfg.default_scope
    model = cfg.model
    bb = model.backbone
    bb.arch = 'test'
    bb.init_cfg = None
    dims = [TINY_HIER_DIMS[i] for i in bb.get('out_indices', (0, 1, 2, 3))]
    if scope == 'mmseg':
        assert model.get('neck') is None, model.neck
        model.data_preprocessor.size = (SEG_SIZE, SEG_SIZE)
        model.decode_head.in_channels = dims
        model.decode_head.channels = 16
        if model.get('auxiliary_head') is not None:
            model.auxiliary_head.in_channels = dims[model.auxiliary_head.in_index]
            model.auxiliary_head.channels = 16
        model.test_cfg = dict(mode='whole')
    elif scope == 'mmdet':
        model.neck.in_channels = dims
        _shrink_det_test_cfg(model)
    elif scope == 'mmpretrain':
        assert bb.out_type == 'avg_featmap' and len(dims) == 1, bb
        model.head.in_channels = dims[-1]
    else:
        raise AssertionError(f'unexpected default_scope {scope!r}')
    _sync_bn_to_bn(model)
    return cfg


def shrink_plain_mamba(cfg):
    """``shrink`` for PlainMamba: its ``'test'`` architecture (C = ``TINY_DIMS``, 4 layers);
    ``out_indices`` keep their count, moved to the last layers ((5, 11, 17, 23) -> (0, 1, 2, 3),
    (-1, ) or -1 -> (3, )); the heads (and the neck, where there is one: the official UperNet has
    none) take ``TINY_DIMS`` channels."""
    scope = cfg.default_scope
    model = cfg.model
    bb = model.backbone
    n_out = _num_out(bb.get('out_indices', -1))
    assert 1 <= n_out <= 4, bb.get('out_indices')
    bb.arch = 'test'
    bb.init_cfg = None
    bb.out_indices = tuple(range(4 - n_out, 4))
    if model.get('neck') is not None:
        model.neck.in_channels = TINY_DIMS
    if scope == 'mmseg':
        bb.img_size = SEG_SIZE
        model.data_preprocessor.size = (SEG_SIZE, SEG_SIZE)
        model.decode_head.in_channels = [TINY_DIMS] * 4
        model.decode_head.channels = 16
        if model.get('auxiliary_head') is not None:
            model.auxiliary_head.in_channels = TINY_DIMS
            model.auxiliary_head.channels = 16
        model.test_cfg = dict(mode='whole')
    elif scope == 'mmdet':
        bb.img_size = DET_SIZE
        for aug in model.data_preprocessor.get('batch_augments') or []:
            if aug.get('type') == 'BatchFixedSizePad':
                aug.size = (DET_SIZE, DET_SIZE)
        # a square pad (the official Vim detector pads to 1024 x 1024) shrinks with the images
        if model.data_preprocessor.get('pad_size_divisor', 1) > DET_SIZE:
            model.data_preprocessor.pad_size_divisor = DET_SIZE
        _shrink_det_test_cfg(model)
    elif scope == 'mmpretrain':
        assert bb.out_type == 'avg_featmap' and n_out == 1, bb
        bb.img_size = CLS_SIZE
        model.head.in_channels = TINY_DIMS
    else:
        raise AssertionError(f'unexpected default_scope {scope!r}')
    _sync_bn_to_bn(model)
    return cfg


def build_model(cfg):
    import importlib
    scope = cfg.default_scope
    registry = importlib.import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        model = registry.build(cfg.model)
    return model.eval()


def _img(size, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, size, size), generator=g, dtype=torch.uint8)


@torch.no_grad()
def run_forward(cfg, model):
    """One CPU forward in the config's task; checks the output shapes."""
    scope = cfg.default_scope
    with DefaultScope.overwrite_default_scope(scope):
        if scope == 'mmseg':
            from mmseg.structures import SegDataSample
            s = SEG_SIZE
            out = model(torch.rand(2, 3, s, s), mode='tensor')
            num_classes = cfg.model.decode_head.num_classes
            assert out.shape[:2] == (2, num_classes) and out.shape[2] > 0, out.shape
            assert torch.isfinite(out).all()
            meta = dict(img_shape=(s, s), ori_shape=(s, s), pad_shape=(s, s))
            preds = model.test_step(dict(inputs=[_img(s)],
                                         data_samples=[SegDataSample(metainfo=meta)]))
            assert preds[0].pred_sem_seg.data.shape == (1, s, s)
        elif scope == 'mmdet':
            from mmdet.structures import DetDataSample
            s = DET_SIZE
            meta = dict(img_id=0, img_shape=(s, s), ori_shape=(s, s), scale_factor=(1.0, 1.0))
            preds = model.test_step(dict(inputs=[_img(s)],
                                         data_samples=[DetDataSample(metainfo=meta)]))
            inst = preds[0].pred_instances
            assert inst.bboxes.ndim == 2 and inst.bboxes.shape[-1] == 4
            assert len(inst.scores) == len(inst.labels) == len(inst.bboxes)
            if 'masks' in inst:
                assert inst.masks.shape[1:] == (s, s)
            assert inst.labels.numel() == 0 or int(inst.labels.max()) < 80
        else:
            out = model(torch.rand(2, 3, CLS_SIZE, CLS_SIZE), mode='tensor')
            assert out.shape == (2, cfg.model.head.num_classes), out.shape
            assert torch.isfinite(out).all()


# ----------------------------------------------------------------------------------- tests
@pytest.mark.parametrize('path', CONFIGS, ids=IDS)
def test_config_builds_and_runs(path, tmp_path):
    cfg = _load(path, tmp_path)
    assert cfg.default_scope in ('mmseg', 'mmdet', 'mmpretrain')
    assert 'amvim_mm' in cfg.custom_imports['imports']
    assert cfg.model.backbone.type in BACKBONES
    # the config names its backbone type as the first part of its file name
    assert osp.basename(path).split('-')[0] == cfg.model.backbone.type.lower()
    shrink(cfg)
    model = build_model(cfg)
    assert type(model.backbone).__name__ == cfg.model.backbone.type
    if cfg.model.backbone.type in HIERARCHICAL_BACKBONES:
        assert list(model.backbone.dims) == list(TINY_HIER_DIMS)
        assert model.backbone.num_layers == TINY_HIER_LAYERS
    else:
        assert model.backbone.embed_dims == TINY_DIMS and model.backbone.num_layers == 4
    run_forward(cfg, model)


def _family(prefix):
    """The backbone family whose type ``prefix`` (a file-name prefix) names."""
    return next(f for f in FAMILIES if prefix in {t.lower() for t in f})


# every config x every other backbone type of its family (the config's own type is the
# file-name prefix, which test_config_builds_and_runs checks)
SWAPS = [pytest.param(c, t, id=f'{i}->{t}') for c, i in zip(CONFIGS, IDS, strict=True)
         for t in _family(osp.basename(c).split('-')[0])
         if t.lower() != osp.basename(c).split('-')[0]]


@pytest.mark.parametrize('path,target', SWAPS)
def test_backbone_swappable_by_one_line(path, target, tmp_path):
    """``cfg.model.backbone.type = TARGET`` is the only change needed to swap the backbone."""
    cfg = _load(path, tmp_path)
    assert cfg.model.backbone.type != target, 'the file name prefix names another backbone'
    cfg.model.backbone.type = target          # the one-line override
    shrink(cfg, arch='test')
    own_keys = {k for t, keys in TYPE_SPECIFIC_KEYS.items() if t != target for k in keys}
    extra = sorted(own_keys & set(cfg.model.backbone))
    assert not extra, (f'{osp.basename(path)} sets {extra} in its backbone, which {target} '
                       'does not take: the one-line swap would need these keys removed too')
    model = build_model(cfg)
    assert type(model.backbone).__name__ == target
    run_forward(cfg, model)


@pytest.mark.parametrize('path', CONFIGS, ids=IDS)
def test_config_file_name_convention(path):
    name = osp.basename(path)
    m = NAME_RE.match(name)
    assert m, (f'{name} does not follow {{backbone}}_{{neck}}_{{head}}_{{gpus}}xb{{batch}}-'
               f'{{schedule}}_{{dataset}}-{{crop}}[_tokenreduce].py')
    folder = osp.basename(osp.dirname(path))
    backbone = m['backbone'].split('-')[0]
    if folder == 'demo':
        assert m['backbone'].endswith('-demo')
        # the segmentation, detection and classification demos
        assert (m['neck'], m['head']) in (('pyramid', 'upernet'), ('sfp', 'retinanet'),
                                          (None, 'linear'), (None, 'segmenter-mask'))
    else:
        assert backbone == folder, f'{name} is in configs/{folder}/'
    hierarchical = _family(backbone) == HIERARCHICAL_BACKBONES
    if m['dataset'] == 'ade20k':
        # a hierarchical backbone feeds UperNet directly; a plain one through PlainPyramidNeck;
        # PlainMamba either way (official: its four stride-16 maps directly; ours: the pyramid)
        if hierarchical:
            allowed = {(None, 'upernet')}
        elif _family(backbone) == PLAIN_MAMBA_BACKBONES:
            allowed = {(None, 'upernet'), ('pyramid', 'upernet')}
        else:     # or Segmenter's heads on the kept tokens (issue 54)
            allowed = {('pyramid', 'upernet'), (None, 'segmenter-mask'),
                       (None, 'segmenter-linear')}
        assert (m['neck'], m['head']) in allowed, (m['neck'], m['head'])
    elif m['dataset'] == 'coco':
        assert m['neck'] == ('fpn' if hierarchical else 'sfp')
        assert m['head'] in ('mask-rcnn', 'cascade-mask-rcnn')
    elif m['dataset'] == 'in1k':
        assert m['neck'] is None and m['head'] == 'linear'
    assert int(m['gpus']) >= 1 and int(m['batch']) >= 1


def test_file_name_regex_rejects_bad_names():
    assert NAME_RE.match('vim-t_pyramid_upernet_8xb2-160k_ade20k-512x512.py')
    assert NAME_RE.match('amvim-t_pyramid_upernet_8xb2-160k_ade20k-512x512_tokenreduce.py')
    assert NAME_RE.match('vim-t_pyramid_upernet_4xb8-60k_ade20k-512x512_official-code.py')
    assert NAME_RE.match('vim-t_pyramid_upernet_8xb2-160k_ade20k-512x512_paper-text.py')
    assert NAME_RE.match(
        'vim-t_pyramid_upernet_4xb8-60k_ade20k-512x512_official-code_tokenreduce.py')
    assert NAME_RE.match('vil-t-v1_pyramid_upernet_8xb2-160k_ade20k-512x512_official-code.py')
    assert NAME_RE.match('vim-t_linear_8xb128-300e_in1k-224.py')
    assert NAME_RE.match('vmamba-t_upernet_4xb4-160k_ade20k-512x512.py')
    assert NAME_RE.match('vmamba-t_fpn_mask-rcnn_8xb2-ms-crop-3x_coco-1333x800.py')
    assert NAME_RE.match('plainmamba-l1_upernet_8xb2-160k_ade20k-512x512.py')
    assert NAME_RE.match('plainmamba-l1_sfp_mask-rcnn_8xb2-1x_coco-1333x800.py')
    assert NAME_RE.match('plainmamba-l3_linear_4xb256-300e_in1k-224.py')
    assert not NAME_RE.match('plainmamba_upernet_8xb2-160k_ade20k-512x512.py')
    assert not NAME_RE.match('vim-t_pyramid_upernet_8x2-160k_ade20k-512x512.py')
    assert not NAME_RE.match('vim-t_pyramid_upernet_8xb2_ade20k-512x512.py')
    assert not NAME_RE.match('vim_pyramid_upernet_8xb2-160k_ade20k-512x512.py')
    assert not NAME_RE.match('vim-t_pyramid_upernet_8xb2-160k_ade20k-512x512_reduce.py')
    assert not NAME_RE.match('vim-t_pyramid_upernet_8xb2-160k_ade20k-512x512_official.py')
    assert not NAME_RE.match(
        'vim-t_pyramid_upernet_4xb8-60k_ade20k-512x512_tokenreduce_official-code.py')


def _delete_keys(obj, where=''):
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == '_delete_':
                found.append(where or '<root>')
            found += _delete_keys(v, f'{where}.{k}' if where else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            found += _delete_keys(v, f'{where}[{i}]')
    return found


@pytest.mark.parametrize('path', CONFIGS, ids=IDS)
def test_no_leftover_delete_keys(path, tmp_path):
    """A ``_delete_`` with nothing to delete in the bases stays in the merged config, and the
    object built from it gets an unexpected ``_delete_`` argument (e.g. the train loop)."""
    cfg = _load(path, tmp_path)
    assert _delete_keys(cfg.to_dict()) == []


@pytest.mark.parametrize('path', CONFIGS, ids=IDS)
def test_tokenreduce_configs_have_the_hook(path, tmp_path):
    cfg = _load(path, tmp_path)
    hooks = [h for h in (cfg.get('custom_hooks') or []) if h.get('type') == 'TokenReductionHook']
    if path.endswith('_tokenreduce.py'):
        assert len(hooks) == 1, cfg.get('custom_hooks')
        red = hooks[0].reduction
        assert red['type'] in TOKEN_REDUCERS.module_dict
        assert 0 < red.get('ratio', red.get('keep_rate', 0)) < 1, red
        assert 'train' not in tuple(hooks[0].get('phases', ('val', 'test')))
        # everything else equals the config it extends
        base = _load(path.replace('_tokenreduce.py', '.py'), tmp_path)
        assert cfg.model == base.model
    else:
        assert not hooks, f'{osp.basename(path)} reduces tokens but has no _tokenreduce suffix'


ALL_CONFIG_FILES = sorted(glob.glob(osp.join(CONFIG_DIR, '**', '*.py'), recursive=True))


@pytest.mark.parametrize('path', ALL_CONFIG_FILES,
                         ids=[osp.relpath(c, CONFIG_DIR) for c in ALL_CONFIG_FILES])
def test_tools_named_in_config_comments_exist(path):
    """Comments tell users to run ``tools/...py``: those scripts must be there."""
    named = set(re.findall(r'tools/[A-Za-z0-9_./-]+\.py', open(path).read()))
    missing = sorted(t for t in named if not osp.isfile(osp.join(ROOT, t)))
    assert not missing, f'{osp.relpath(path, ROOT)} names {missing}, which do not exist'



PLAIN_MAMBA_CONFIGS = [c for c in CONFIGS if osp.basename(osp.dirname(c)) == 'plainmamba']


@pytest.mark.parametrize('path', PLAIN_MAMBA_CONFIGS,
                         ids=[osp.relpath(c, CONFIG_DIR) for c in PLAIN_MAMBA_CONFIGS])
def test_plain_mamba_configs_match_their_arch(path, tmp_path):
    """At full size (which ``shrink`` overwrites): the neck / head widths are the arch's C, the
    outputs lie in its depth (UperNet: the official evenly spaced layers, (5, 11, 17, 23) of 24,
    (8, 17, 26, 35) of 36), and the dense configs start from that arch's released file."""
    from amvim_mm.models.plain_mamba.plain_mamba import PLAIN_MAMBA_ARCHS
    cfg = _load(path, tmp_path)
    model, bb = cfg.model, cfg.model.backbone
    arch = bb.arch.lower()
    C, depth = PLAIN_MAMBA_ARCHS[arch]['embed_dims'], PLAIN_MAMBA_ARCHS[arch]['num_layers']
    assert osp.basename(path).startswith(f'plainmamba-{arch}_')
    out = bb.get('out_indices', -1)
    out = [out] if isinstance(out, int) else list(out)
    assert all(-depth <= i < depth for i in out), out
    hooks = [h for h in (cfg.get('custom_hooks') or []) if h.get('type') == 'TokenReductionHook']
    if hooks:
        # the schedule fits the full-size model (validated at build); the L3 budget's FLOPs
        from amvim_mm.analysis.plainmamba_flops import plainmamba_flops
        from amvim_mm.registry import MODELS
        full = MODELS.build(dict(type='PlainMamba', arch=arch, img_size=bb.img_size,
                                 token_reduction=hooks[0].reduction))
        if arch == 'l3':
            assert abs(plainmamba_flops(full, 224, 'model', 1000)['gflops'] - 8.44) < 0.01
    if cfg.default_scope == 'mmpretrain':
        assert model.head.in_channels == C and bb.out_type == 'avg_featmap'
        return
    assert bb.init_cfg == dict(type='Pretrained', checkpoint=f'pretrain/{arch}.pth')
    if cfg.default_scope == 'mmseg':
        assert out == [depth // 4 * k - 1 for k in (1, 2, 3, 4)], out
        if model.get('neck') is not None:
            assert model.neck.in_channels == C
        assert model.decode_head.in_channels == [C] * 4
        assert model.auxiliary_head.in_channels == C
    else:
        assert model.neck.in_channels == C and out in ([-1], [depth - 1])


FINETUNE_CONFIGS = [c for c in CONFIGS if c.endswith(('_dynamicvit.py', '_ltmp.py'))]


@pytest.mark.parametrize('path', FINETUNE_CONFIGS,
                         ids=[osp.relpath(c, CONFIG_DIR) for c in FINETUNE_CONFIGS])
def test_finetuning_configs_build_the_wrapper(path, tmp_path):
    """A learned reducer's fine-tuning config builds ReducerFineTuner (student with the
    reducer, teacher without) at the test size, and its student runs the inference path."""
    wrapper = _load(path, tmp_path, unwrap=False).model
    assert wrapper.type == 'ReducerFineTuner'
    student = shrink(_load(path, tmp_path))    # the student config, shrunk like every config
    wrapper.model = copy.deepcopy(student.model)
    built = copy.deepcopy(student)
    built.model = wrapper
    model = build_model(built)
    assert getattr(model.backbone.token_reducer, 'learned', False)
    distills = wrapper.get('logit_weight', 0.5) or wrapper.get('token_weight', 0.5)
    assert (model.teacher is None) == (not distills)
    if model.teacher is not None:
        assert model.teacher.backbone.token_reducer is None
    run_forward(student, model)
