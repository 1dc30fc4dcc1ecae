"""The official-code dense configs of ViL-T v1 and LocalVim-T against tables of the official
values, written out here from the sources (one row per setting):

* ViL: NX-AI/vision-lstm @ 381ba95, ``src/vislstm/yamls/segmentation/vil_t16_upernet160k_dim192
  .yaml`` and the code it names (``UpernetModel`` / ``UpernetPostprocessor`` / ``UperNetDecoder``
  / ``UpernetAuxiliary``, ``LayerwiseLrDecay``, ksuit's ``OptimWrapper``, the slide callback);
* LocalVim: hunto/LocalMamba @ 75e5d1f, ``segmentation/configs/local_mamba/
  upernet_local_vim-tiny_8xb2-160k_ade20k-512x512.py`` on mmseg's ViT UperNet base, and
  ``Backbone_LocalVisionMamba``.

Also the optimizer groups these configs give (lr and weight decay per parameter, against the
official rules restated here) and the layer-decay pair grouping of a small ViL v1.
"""
import copy
import math
import os.path as osp

import numpy as np
import pytest
import torch
import torch.nn as nn
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

from amvim_mm.apis.runner import load_config
from amvim_mm.engine.optim import LayerDecayOptimWrapperConstructor
from amvim_mm.registry import MODELS

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
VIL = osp.join(ROOT, 'configs', 'vil',
               'vil-t-v1_pyramid_upernet_1xb16-160k_ade20k-512x512_official-code.py')
LOCALVIM = osp.join(ROOT, 'configs', 'localvim',
                    'localvim-t_pyramid_upernet_8xb2-160k_ade20k-512x512_official-code.py')


def _gpus(path):
    return int(osp.basename(path).split('_')[3].split('xb')[0])


def _total_batch(cfg, path):
    return _gpus(path) * cfg.train_dataloader.batch_size


def _step(pipeline, typ):
    steps = [t for t in pipeline if t['type'] == typ]
    assert len(steps) == 1, (typ, [t['type'] for t in pipeline])
    return steps[0]


def _sched(cfg, typ):
    return next(s for s in cfg.param_scheduler if s['type'] == typ)


# (setting, value in the config, official value)
VIL_OFFICIAL = [
    ('ViL v1, dim 192, 24 blocks', lambda c: c.model.backbone.arch, 'tiny-v1'),
    ('block_extractor block_indices', lambda c: tuple(c.model.backbone.out_indices),
     (7, 11, 15, 23)),
    ('raw block outputs (the residual stream)', lambda c: c.model.backbone.tap, 'stream'),
    ('drop_path_rate', lambda c: c.model.backbone.drop_path_rate, 0.0),
    ('drop_path_decay', lambda c: c.model.backbone.drop_path_decay, True),
    ('released v1 file of the e800 run', lambda c: c.model.backbone.init_cfg.checkpoint,
     'pretrain/vil_tiny16_e800_in1k.th'),
    ('BEiT pyramid x4 / x2 / x1 / x0.5', lambda c: tuple(c.model.neck.scales), (4, 2, 1, 0.5)),
    ('BatchNorm2d in the pyramid (one GPU)', lambda c: c.model.neck.norm_cfg.type in
     ('BN', 'SyncBN'), True),
    ('pyramid init: torch default (the xavier call is a no-op)',
     lambda c: c.model.neck.get('init_cfg'), None),
    ('decoder dim', lambda c: c.model.decode_head.channels, 192),
    ('decoder inputs', lambda c: list(c.model.decode_head.in_index), [0, 1, 2, 3]),
    ('decoder pool scales', lambda c: tuple(c.model.decode_head.pool_scales), (1, 2, 3, 6)),
    ('decoder dropout', lambda c: c.model.decode_head.dropout_ratio, 0.0),
    ('auxiliary_feature_idx', lambda c: c.model.auxiliary_head.in_index, 2),
    ('auxiliary dim', lambda c: c.model.auxiliary_head.channels, 192),
    ('auxiliary convs', lambda c: c.model.auxiliary_head.num_convs, 1),
    ('auxiliary dropout', lambda c: c.model.auxiliary_head.dropout_ratio, 0.0),
    ('loss_weights.auxiliary', lambda c: c.model.auxiliary_head.loss_decode.loss_weight, 0.4),
    ('optimizer', lambda c: c.optim_wrapper.optimizer.type, 'AdamW'),
    ('lr 5e-4 x batch / 16 (linear_lr_scaler)', lambda c: c.optim_wrapper.optimizer.lr,
     5e-4 * 16 / 16),
    ('betas', lambda c: tuple(c.optim_wrapper.optimizer.betas), (0.9, 0.999)),
    ('weight_decay', lambda c: c.optim_wrapper.optimizer.weight_decay, 0.05),
    ('layerwise_lr_decay', lambda c: c.optim_wrapper.paramwise_cfg.layer_decay_rate, 0.65),
    ('group_two_blocks', lambda c: c.model.backbone.layer_depth_per_pair, True),
    ('decay constructor', lambda c: c.optim_wrapper.constructor,
     'LayerDecayOptimWrapperConstructor'),
    ('exclude_bias_from_wd / exclude_norm_from_wd',
     lambda c: c.optim_wrapper.paramwise_cfg.flat_decay_mult, 0.0),
    ('no other leaf-name rule', lambda c: tuple(c.optim_wrapper.paramwise_cfg.no_decay_leaves),
     ()),
    ('learnable pos_embed.embed: weight decay 0',
     lambda c: tuple(c.optim_wrapper.paramwise_cfg.no_decay_names), ('pos_embed.embed', )),
    ('precision float16 (GradScaler)', lambda c: (c.optim_wrapper.type, c.optim_wrapper.dtype),
     ('AmpOptimWrapper', 'float16')),
    ('warmup_updates', lambda c: (_sched(c, 'LinearLR').begin, _sched(c, 'LinearLR').end),
     (0, 1500)),
    ('cosine after the warm-up', lambda c: (_sched(c, 'CosineAnnealingLR').begin,
                                            _sched(c, 'CosineAnnealingLR').end,
                                            _sched(c, 'CosineAnnealingLR').T_max),
     (1500, 160000, 158500)),
    ('end_value 1e-6 (times each group\'s scale)',
     lambda c: _sched(c, 'CosineAnnealingLR').eta_min_ratio * c.optim_wrapper.optimizer.lr,
     pytest.approx(1e-6)),
    ('updates', lambda c: c.train_cfg.max_iters, 160000),
    ('batch_size 16 on one GPU (world size 1)', lambda c: (_gpus(VIL), _total_batch(c, VIL)),
     (1, 16)),
    ('lr given for the file\'s batch, no automatic scaling',
     lambda c: (c.auto_scale_lr.enable, c.auto_scale_lr.base_batch_size), (False, 16)),
    ('resize ratio_resolution / ratio_range / bicubic',
     lambda c: (tuple(_step(c.train_pipeline, 'RandomResize').scale),
                tuple(_step(c.train_pipeline, 'RandomResize').ratio_range),
                _step(c.train_pipeline, 'RandomResize').interpolation),
     ((2048, 512), (0.5, 2.0), 'bicubic')),
    ('random crop 512, max_category_ratio 0.75',
     lambda c: (tuple(_step(c.train_pipeline, 'RandomCrop').crop_size),
                _step(c.train_pipeline, 'RandomCrop').cat_max_ratio), ((512, 512), 0.75)),
    ('horizontal flip p 0.5', lambda c: _step(c.train_pipeline, 'RandomFlip').prob, 0.5),
    ('color_jitter 0.5 / 0.5 / 0.5 / 0.25',
     lambda c: {k: _step(c.train_pipeline, 'TorchvisionColorJitter')[k]
                for k in ('brightness', 'contrast', 'saturation', 'hue')},
     dict(brightness=0.5, contrast=0.5, saturation=0.5, hue=0.25)),
    ('no PhotoMetricDistortion', lambda c: [t['type'] for t in c.train_pipeline
                                            if t['type'] == 'PhotoMetricDistortion'], []),
    ('the train loader runs this pipeline',
     lambda c: c.train_dataloader.dataset.pipeline == c.train_pipeline, True),
    ('slide 512, stride 341', lambda c: (c.model.test_cfg.mode, tuple(c.model.test_cfg.crop_size),
                                         tuple(c.model.test_cfg.stride)),
     ('slide', (512, 512), (341, 341))),
    ('F.interpolate(x, size=512): 512 x 512, aspect ratio not kept',
     lambda c: (tuple(_step(c.test_pipeline, 'Resize').scale),
                _step(c.test_pipeline, 'Resize').keep_ratio), ((512, 512), False)),
    ('the val loader runs this pipeline',
     lambda c: c.val_dataloader.dataset.pipeline == c.test_pipeline, True),
    ('offline_segmentation_callback every_n_updates', lambda c: c.train_cfg.val_interval, 10000),
    ('best_checkpoint_callback on val mIoU',
     lambda c: (c.default_hooks.checkpoint.save_best, c.default_hooks.checkpoint.interval),
     ('mIoU', 10000)),
]

# LocalMamba: the local_vim-tiny config over mmseg's vit_vit-b16_mln_upernet base
LOCALVIM_OFFICIAL = [
    ('MM_LocalVim (depth 20, dim 192)', lambda c: (c.model.backbone.type, c.model.backbone.arch),
     ('LocalVim', 'tiny')),
    ('out_indices', lambda c: tuple(c.model.backbone.out_indices), (4, 9, 14, 19)),
    ('hidden_states of the taps (no residual)', lambda c: c.model.backbone.tap, 'mixer'),
    ('no class token', lambda c: c.model.backbone.with_cls_token, False),
    ('norm_f deleted', lambda c: c.model.backbone.final_norm, False),
    ('drop_path_rate', lambda c: c.model.backbone.drop_path_rate, 0.1),
    ('neck=None: the four stride-16 maps unchanged', lambda c: tuple(c.model.neck.scales),
     (1, 1, 1, 1)),
    ('outnorm_i: nn.LayerNorm(D) (eps 1e-5) on every tap',
     lambda c: dict(c.model.neck.in_norm_cfg), dict(type='LN2d', eps=1e-5)),
    ('UPerHead channels (ViT base)', lambda c: c.model.decode_head.channels, 512),
    ('UPerHead in_index', lambda c: list(c.model.decode_head.in_index), [0, 1, 2, 3]),
    ('UPerHead pool scales', lambda c: tuple(c.model.decode_head.pool_scales), (1, 2, 3, 6)),
    ('UPerHead dropout', lambda c: c.model.decode_head.dropout_ratio, 0.1),
    ('FCNHead in_index (the layer-19 map, x1)', lambda c: c.model.auxiliary_head.in_index, 3),
    ('FCNHead channels', lambda c: c.model.auxiliary_head.channels, 256),
    ('FCNHead convs', lambda c: c.model.auxiliary_head.num_convs, 1),
    ('FCNHead dropout', lambda c: c.model.auxiliary_head.dropout_ratio, 0.1),
    ('FCNHead loss weight', lambda c: c.model.auxiliary_head.loss_decode.loss_weight, 0.4),
    ('SyncBN in the heads', lambda c: c.model.decode_head.norm_cfg.type, 'SyncBN'),
    ('AdamW', lambda c: c.optim_wrapper.optimizer.type, 'AdamW'),
    ('lr', lambda c: c.optim_wrapper.optimizer.lr, 6e-5),
    ('betas', lambda c: tuple(c.optim_wrapper.optimizer.betas), (0.9, 0.999)),
    ('weight_decay', lambda c: c.optim_wrapper.optimizer.weight_decay, 0.01),
    ('no layer decay (mmengine\'s own constructor)',
     lambda c: c.optim_wrapper.get('constructor'), None),
    ('custom_keys decay_mult 0', lambda c: {k: v['decay_mult'] for k, v in
                                            c.optim_wrapper.paramwise_cfg.custom_keys.items()},
     {'pos_embed': 0.0, 'cls_token': 0.0, 'norm': 0.0}),
    ('fp32 (plain OptimWrapper)', lambda c: c.optim_wrapper.type, 'OptimWrapper'),
    ('LinearLR 1e-6 over 1500', lambda c: (_sched(c, 'LinearLR').start_factor,
                                           _sched(c, 'LinearLR').begin,
                                           _sched(c, 'LinearLR').end), (1e-6, 0, 1500)),
    ('PolyLR power 1 to 0', lambda c: (_sched(c, 'PolyLR').power, _sched(c, 'PolyLR').eta_min,
                                       _sched(c, 'PolyLR').begin, _sched(c, 'PolyLR').end),
     (1.0, 0.0, 1500, 160000)),
    ('160k iterations, val every 16k', lambda c: (c.train_cfg.max_iters, c.train_cfg.val_interval),
     (160000, 16000)),
    ('checkpoint every 16k, no best-checkpoint selection',
     lambda c: (c.default_hooks.checkpoint.interval, c.default_hooks.checkpoint.get('save_best')),
     (16000, None)),
    ('8 GPUs x 2', lambda c: (_gpus(LOCALVIM), c.train_dataloader.batch_size), (8, 2)),
    ('PhotoMetricDistortion', lambda c: [t['type'] for t in c.train_dataloader.dataset.pipeline]
     .count('PhotoMetricDistortion'), 1),
    ('test: shorter side 512', lambda c: tuple(_step(c.val_dataloader.dataset.pipeline,
                                                     'Resize').scale), (2048, 512)),
    ('test_cfg whole (ViT base)', lambda c: c.model.test_cfg.to_dict(), dict(mode='whole')),
]


@pytest.fixture(scope='module')
def vil_cfg(tmp_path_factory):
    return load_config(VIL, work_dir=str(tmp_path_factory.mktemp('vil')))


@pytest.fixture(scope='module')
def localvim_cfg(tmp_path_factory):
    return load_config(LOCALVIM, work_dir=str(tmp_path_factory.mktemp('localvim')))


@pytest.mark.parametrize('setting,get,official', VIL_OFFICIAL, ids=[r[0] for r in VIL_OFFICIAL])
def test_vil_config_is_the_official_recipe(vil_cfg, setting, get, official):
    assert get(vil_cfg) == official, setting


@pytest.mark.parametrize('setting,get,official', LOCALVIM_OFFICIAL,
                         ids=[r[0] for r in LOCALVIM_OFFICIAL])
def test_localvim_config_is_the_official_recipe(localvim_cfg, setting, get, official):
    assert get(localvim_cfg) == official, setting


def test_first_comment_lines_name_the_recipe():
    vil = open(VIL).read().splitlines()
    assert vil[0].startswith('# Recipe: official code (ViL)')
    assert '41.2' in ' '.join(vil[:5]) and 'vil_tiny16_e800_in1k.th' in ' '.join(vil[:5])
    local = open(LOCALVIM).read().splitlines()
    assert local[0].startswith('# Recipe: official code (LocalMamba)')
    assert '43.4' in ' '.join(local[:5])
    for rel in ('configs/vil/vil-t_pyramid_upernet_8xb2-160k_ade20k-512x512.py',
                'configs/amvil/amvil-t_pyramid_upernet_8xb2-160k_ade20k-512x512.py'):
        head = open(osp.join(ROOT, rel)).read().splitlines()
        assert head[0] == ('# Recipe: ours: ViL v2 weights on the Vim/AMVim recipe for a '
                           'like-for-like comparison; not a')
        assert head[1].startswith('# reproduction; no published number applies')
        assert 'vil-t-v1_pyramid_upernet_1xb16-160k_ade20k-512x512_official-code.py' in \
            ' '.join(head[:4])


def _build(cfg):
    import mmseg.registry
    with DefaultScope.overwrite_default_scope('mmseg'):
        return mmseg.registry.MODELS.build(copy.deepcopy(cfg.model))


def _groups(model, optim_cfg):
    """{parameter name: (lr, weight decay)} of the optimizer the config builds, for every
    trained parameter (an AMP wrapper as a plain one: mmengine's AmpOptimWrapper needs a GPU;
    the groups are the same)."""
    optim_cfg = copy.deepcopy(optim_cfg)
    optim_cfg.pop('dtype', None)
    optim_cfg.pop('loss_scale', None)
    optim_cfg['type'] = 'OptimWrapper'
    with DefaultScope.overwrite_default_scope('mmseg'):
        wrapper = build_optim_wrapper(model, optim_cfg)
    by_id = {}
    for g in wrapper.optimizer.param_groups:
        for p in g['params']:
            by_id[id(p)] = (g['lr'], g['weight_decay'])
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert set(map(id, trained.values())) == set(by_id)
    return {n: by_id[id(p)] for n, p in trained.items()}


def _official_vil_scale(name):
    """vislstm.optim.layerwise_lr_decay.LayerwiseLrDecay(0.65, group_two_blocks=True) on the
    encoder (24 blocks: 13 "layers"); the decoder, auxiliary and postprocessor optimisers have
    no modifier (scale 1)."""
    if not name.startswith('backbone.'):
        return 1.0
    name = name[len('backbone.'):]
    num_layers = 24 // 2 + 1
    scales = [0.65 ** (num_layers - i) for i in range(num_layers)]
    if name.startswith(('pos_embed', 'patch_embed')):
        return scales[0]
    if name.startswith('blocks.'):
        layer = int(name.split('.')[1]) + 1
        return scales[(layer - 1) // 2 + 1]
    return 1.0       # the norms after the blocks


def test_vil_optimizer_groups_follow_the_official_rules(vil_cfg):
    model = _build(vil_cfg)
    groups = _groups(model, vil_cfg.optim_wrapper)
    lr = vil_cfg.optim_wrapper.optimizer.lr
    params = dict(model.named_parameters())
    assert any(n.startswith('backbone.blocks.23.') for n in params)
    for name, (got_lr, got_wd) in groups.items():
        assert got_lr == pytest.approx(lr * _official_vil_scale(name), rel=1e-9), name
        # ksuit OptimWrapper: no decay for '.bias' and every ndim <= 1 parameter; VisLSTM's
        # get_param_group_modifiers: none for the learnable pos_embed.embed
        exempt = params[name].ndim <= 1 or name == 'backbone.pos_embed.embed'
        assert got_wd == (0.0 if exempt else 0.05), name
    assert groups['backbone.patch_embed.proj.weight'][1] == 0.05      # convs are decayed
    assert groups['backbone.blocks.0.layer.conv1d.conv.weight'][1] == 0.05


def test_localvim_optimizer_groups_follow_the_official_rules(localvim_cfg):
    model = _build(localvim_cfg)
    groups = _groups(model, localvim_cfg.optim_wrapper)
    assert len(model.backbone.layers) == 20
    for name, (got_lr, got_wd) in groups.items():
        assert got_lr == 6e-5, name
        # mmengine's custom_keys: a key that is a substring of the name sets decay_mult 0
        exempt = any(k in name for k in ('pos_embed', 'cls_token', 'norm'))
        assert got_wd == (0.0 if exempt else 0.01), name
    assert groups['backbone.layers.0.mixer.A_log_0'][1] == 0.01     # decayed, as official
    assert groups['backbone.layers.0.mixer.in_proj.weight'][1] == 0.01


def test_colour_jitter_runs_from_the_mmseg_pipeline(vil_cfg):
    """The config's jitter is found from mmseg's registry (``custom_imports`` brings
    ``amvim_mm.datasets``), every pipeline step resolves, and the jitter draws from
    torchvision's ranges: factors in [0.5, 1.5], a hue shift in [-0.25, 0.25]."""
    import mmseg.registry
    assert 'amvim_mm.datasets' in vil_cfg.custom_imports['imports']
    step = _step(vil_cfg.train_pipeline, 'TorchvisionColorJitter')
    with DefaultScope.overwrite_default_scope('mmseg'):
        jitter = mmseg.registry.TRANSFORMS.build(copy.deepcopy(step))
        for t in vil_cfg.train_pipeline + vil_cfg.test_pipeline:
            assert mmseg.registry.TRANSFORMS.get(t['type']) is not None, t['type']
    assert jitter.ranges == dict(brightness=(0.5, 1.5), contrast=(0.5, 1.5),
                                 saturation=(0.5, 1.5), hue=(-0.25, 0.25))
    img = np.random.default_rng(0).integers(0, 256, (32, 48, 3), dtype=np.uint8)
    torch.manual_seed(0)
    out = jitter(dict(img=img.copy()))['img']
    assert out.shape == img.shape and out.dtype == np.uint8 and not np.array_equal(out, img)


@pytest.mark.parametrize('which', ['vil', 'localvim'])
def test_pipelines_run_on_an_ade20k_like_sample(which, vil_cfg, localvim_cfg, tmp_path):
    """The configs' train and test pipelines run end to end on one image / label pair in the
    ADE20K format (train: a crop of at most 512; ViL's test: 512 x 512 whatever the aspect ratio, the
    label at its original size; LocalVim's test: shorter side 512)."""
    import cv2
    import mmseg.registry
    from mmengine.dataset import Compose
    cfg = vil_cfg if which == 'vil' else localvim_cfg
    rng = np.random.default_rng(0)
    img, seg = tmp_path / 'a.jpg', tmp_path / 'a.png'
    cv2.imwrite(str(img), rng.integers(0, 256, (300, 400, 3), dtype=np.uint8))
    cv2.imwrite(str(seg), rng.integers(0, 151, (300, 400), dtype=np.uint8))
    sample = dict(img_path=str(img), seg_map_path=str(seg), reduce_zero_label=True,
                  seg_fields=[])
    with DefaultScope.overwrite_default_scope('mmseg'):
        mmseg.registry.TRANSFORMS.import_from_location()
        train = Compose(copy.deepcopy(cfg.train_dataloader.dataset.pipeline))
        test = Compose(copy.deepcopy(cfg.val_dataloader.dataset.pipeline))
        torch.manual_seed(0)
        np.random.seed(0)
        for _ in range(3):     # crops of at most 512 (a smaller resize is padded later)
            out = train(copy.deepcopy(sample))
            c, h, w = out['inputs'].shape
            assert c == 3 and h <= 512 and w <= 512
            assert tuple(out['data_samples'].gt_sem_seg.data.shape) == (1, h, w)
        out = test(copy.deepcopy(sample))
    want = (512, 512) if which == 'vil' else (512, 683)
    assert tuple(out['inputs'].shape[1:]) == want
    assert tuple(out['data_samples'].gt_sem_seg.data.shape[1:]) == (300, 400)


class _Seg(nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(8, 2)


def _lrs(model, rate):
    cons = LayerDecayOptimWrapperConstructor(
        dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.05)),
        dict(layer_decay_rate=rate))
    lr_of = {}
    for g in cons(model).optimizer.param_groups:
        for p in g['params']:
            lr_of[id(p)] = g['lr']
    return {n: lr_of[id(p)] for n, p in model.named_parameters()}


@pytest.mark.parametrize('depth', [6, 5])
def test_v1_layer_decay_groups_block_pairs(depth):
    """ViL v1: blocks 2k and 2k+1 share an lr (the official group_two_blocks); one rate step
    per pair; embeddings one step below the first pair, the final norms and the head at the
    base lr; ``layer_depth_per_pair=False`` gives every block its own lr."""
    arch = dict(version=1, embed_dims=16, num_layers=depth)
    model = _Seg(MODELS.build(dict(type='ViL', arch=arch)))
    lrs = _lrs(model, 0.5)
    pairs = math.ceil(depth / 2)
    for b in range(depth):
        names = [n for n in lrs if n.startswith(f'backbone.blocks.{b}.')]
        assert names and {lrs[n] for n in names} == {0.5 ** (pairs - b // 2)}, b
    assert lrs['backbone.pos_embed.embed'] == lrs['backbone.patch_embed.proj.weight'] == \
        0.5 ** (pairs + 1)
    assert lrs['backbone.norm.weight'] == lrs['backbone.legacy_norm.weight'] == 1.0
    assert lrs['head.weight'] == 1.0
    bb = model.backbone
    assert bb.get_layer_depth('backbone.blocks.1.norm.weight', 'backbone.') == (1, pairs + 2)
    assert bb.get_layer_depth('backbone.blocks.2.norm.weight', 'backbone.') == (2, pairs + 2)
    per_block = _Seg(MODELS.build(dict(type='ViL', arch=arch, layer_depth_per_pair=False)))
    lrs = _lrs(per_block, 0.5)
    assert len({lrs[f'backbone.blocks.{b}.norm.weight'] for b in range(depth)}) == depth
    assert lrs['backbone.blocks.0.norm.weight'] == 0.5 ** depth


def test_v2_layer_depth_is_per_pair_either_way():
    """v2's blocks are pairs already (the official rule without group_two_blocks)."""
    for flag in (True, False):
        m = MODELS.build(dict(type='ViL', arch='test', layer_depth_per_pair=flag))
        assert m.get_layer_depth('backbone.blocks.3.rowwise_from_bot_right.norm.weight',
                                 'backbone.') == (4, 6)
    assert m.get_layer_depth('backbone.pos_embed.embed', 'backbone.') == (0, 6)


def test_vil_config_outputs_are_the_official_taps(vil_cfg):
    """At full size: ViL-T v1 (24 blocks) taps blocks 7, 11, 15, 23; each of the four maps is
    a block's output, the neck's first level the x4 one."""
    model = _build(vil_cfg).eval()
    assert model.backbone.version == 1 and model.backbone.num_layers == 24
    assert model.backbone.embed_dims == 192
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        feats = model.backbone(x)
        pyramid = model.neck(feats)
    assert [tuple(f.shape) for f in feats] == [(1, 192, 4, 4)] * 4
    assert [tuple(f.shape[-2:]) for f in pyramid] == [(16, 16), (8, 8), (4, 4), (2, 2)]
