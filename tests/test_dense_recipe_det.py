"""The official-code Vim-T Cascade Mask R-CNN config against what the official code ran
(hustvl/Vim @ dd0358a ``det/``: ``scripts/ft_vim_tiny_vimdet.sh`` ->
``projects/ViTDet/configs/COCO/cascade_mask_rcnn_vimdet_t_100ep_adj1.py`` ->
``cascade_mask_rcnn_vimdet_b_100ep.py`` -> ``mask_rcnn_vimdet_b_100ep.py`` ->
``configs/common/models/mask_rcnn_vimdet.py``, ``common/optim.py``,
``projects/ViTDet/configs/common/coco_loader_lsj.py``; the values are written out below, one row
per setting of the spec's table).

* ``test_official_code_config_matches_the_official_table``: every row against the composed
  config; the first comment names the recipe and the deviations.
* ``test_test_images_are_padded_to_a_1024_square``: the config's own test resize and data
  preprocessor turn images of 1024x683, 640x1024 and 640x480 (W x H) into 1024 x 1024 inputs
  padded with zeros after normalisation (detectron2's ``square_pad=1024``), alone and batched;
  in training the masks are padded with the images.
* ``test_small_detector_has_the_official_heads``: the detector built small (the tiny backbone
  of ``tests/test_configs.py``) has an RPN with 2 convs, three Shared4Conv1FC box heads with
  LN2d after each conv, class-agnostic regression, FCN mask heads with LN2d, and computes
  finite losses and predictions.
* ``test_optimizer_groups_follow_the_official_rule``: every parameter's lr and weight decay
  equal detectron2's ``get_default_optimizer_params`` with ``get_vim_lr_decay_rate`` (re-stated
  below) on a 24-block model.
"""
import copy
import math
import os.path as osp
import re

import pytest
import torch
from mmengine.registry import DefaultScope

from amvim_mm.apis.runner import load_config

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG = osp.join(ROOT, 'configs', 'vim',
                  'vim-t_sfp_cascade-mask-rcnn_4xb16-lsj-184k_coco-1024x1024_official-code.py')
OURS = osp.join(ROOT, 'configs', 'vim',
                'vim-t_sfp_cascade-mask-rcnn_8xb8-lsj-184k_coco-1024x1024.py')

# detectron2 Box2BoxTransform weights (w_xy, w_wh) of the three cascade stages
BOX_WEIGHTS = [(10, 5), (20, 10), (30, 15)]

# setting -> the official value (written from the sources named in the module docstring)
OFFICIAL_TABLE = {
    # VisionMambaDet: out_feature 'last_feat', last_layer_process='add', if_cls_token=False,
    # norm_f deleted, img_size 1024, patch 16, dp 0.1, embed 192 x 24 (adj1)
    'backbone': dict(type='Vim', arch='tiny', img_size=1024, out_indices=(23, ), tap='stream',
                     with_cls_token=False, final_norm=False, drop_path_rate=0.1),
    # SimpleFeaturePyramid(out_channels=256, scale_factors=(4, 2, 1, 0.5), norm='LN',
    # top_block=LastLevelMaxPool())
    'feature pyramid': dict(out_channels=256, scales=(4.0, 2.0, 1.0, 0.5), norm='LN2d',
                            num_outs=5),
    # model.proposal_generator.head.conv_dims = [-1, -1]
    'rpn convs': 2,
    # FastRCNNConvFCHead(conv_dims=[256] * 4, fc_dims=[1024], conv_norm='LN') x 3
    'box head': [dict(type='Shared4Conv1FCBBoxHead', convs=4, conv_channels=256, fcs=1,
                      fc_channels=1024, norm='LN2d')] * 3,
    # FastRCNNOutputLayers(cls_agnostic_bbox_reg=True)
    'class-agnostic regression': [True] * 3,
    # Box2BoxTransform(weights=(w1, w1, w2, w2)): std = 1 / weight
    'target stds': [tuple(round(1 / w, 6) for w in (a, a, b, b)) for a, b in BOX_WEIGHTS],
    # Matcher(thresholds=[th]) for th in [0.5, 0.6, 0.7]
    'stage IoU': [0.5, 0.6, 0.7],
    # smooth_l1_beta=0.0 (the default of RPN and FastRCNNOutputLayers): L1
    'box losses': dict(rpn='L1Loss', stages=('L1Loss', ) * 3),
    # MaskRCNNConvUpsampleHead(conv_dims=[256] * 5: 4 convs + the deconv), conv_norm='LN'
    'mask head': dict(type='FCNMaskHead', convs=4, conv_channels=256, norm='LN2d'),
    # train.amp.enabled = True (GradScaler: fp16, dynamic loss scale)
    'amp': dict(type='AmpOptimWrapper', dtype='float16', loss_scale='dynamic'),
    # common/optim.py AdamW
    'optimizer': dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    # get_vim_lr_decay_rate(num_layers=24, lr_decay_rate=0.837)
    'layer decay rate': 0.837,
    'layer decay scope': 'all',
    # weight_decay_norm=0.0 hits no module (no torch.nn norm in the model); overrides
    # {'pos_embed': {'weight_decay': 0.0}}
    'no weight decay': dict(flat_decay_mult=1.0, no_decay_leaves=('pos_embed', )),
    'iterations': 184375,
    # WarmupParamScheduler(warmup_length=250 / max_iter, warmup_factor=0.001), linear
    'warm-up': dict(start_factor=0.001, end=250),
    # MultiStepParamScheduler(values=[1.0, 0.1, 0.01], milestones=[163889, 177546])
    'steps': dict(milestones=[163889, 177546], gamma=0.1),
    # --num-gpus 4, dataloader.train.total_batch_size = 64
    'gpus x batch': (4, 16),
    'total batch': 64,
    # RandomFlip, ResizeScale(0.1, 2.0, 1024, 1024), FixedSizeCrop(1024, pad=False)
    'train pipeline': ['RandomFlip(0.5)', 'RandomResize(1024x1024; 0.1-2.0)',
                       'RandomCrop(1024x1024)'],
    # ResizeShortestEdge(short_edge_length=1024, max_size=1024)
    'test resize': dict(scale=(1024, 1024), keep_ratio=True),
    # SimpleFeaturePyramid(square_pad=1024): every input padded to 1024 x 1024 with 0 after
    # the normalisation
    'test padding': dict(pad_size_divisor=1024, pad_value=0),
    'pixel mean / std (RGB)': dict(mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375),
                                   bgr_to_rgb=True),
}
# words the first comment must use: the recipe, and what the config cannot match
RECIPE = '# Recipe: official code (hustvl/Vim det/'
COMMENT_WORDS = ('cascade_mask_rcnn_vimdet_t_100ep_adj1.py', 'ft_vim_tiny_vimdet.sh', 'RoPE',
                 '`/2`', 'unreleased v1-style weights', 'fp16_compression',
                 'no mmengine config equivalent', 'get_norm', 'RMSNorm',
                 'not an expected number', '45.7', '39.2')


def _names(pipeline):
    steps = []
    for t in pipeline:
        if t['type'] == 'RandomFlip':
            steps.append(f'RandomFlip({t["prob"]})')
        elif t['type'] == 'RandomResize':
            steps.append('RandomResize({}x{}; {}-{})'.format(*t['scale'], *t['ratio_range']))
        elif t['type'] == 'RandomCrop':
            steps.append('RandomCrop({}x{})'.format(*t['crop_size']))
    return steps


def _file_gpus_batch(path):
    m = re.search(r'_(\d+)xb(\d+)-', osp.basename(path))
    return int(m[1]), int(m[2])


def _actual(cfg, path):
    """The composed config's value for every row of OFFICIAL_TABLE."""
    m = cfg.model
    bb, neck, rpn, roi = m.backbone, m.neck, m.rpn_head, m.roi_head
    ow, opt, pw = cfg.optim_wrapper, cfg.optim_wrapper.optimizer, cfg.optim_wrapper.paramwise_cfg
    sched = {s['type']: s for s in cfg.param_scheduler}
    heads = roi.bbox_head
    assert isinstance(heads, list) and roi.num_stages == len(heads) == 3
    resize = [t for t in cfg.test_pipeline if t['type'] == 'Resize']
    assert len(resize) == 1 and not any(t['type'] == 'Pad' for t in cfg.test_pipeline)
    gpus, per_gpu = _file_gpus_batch(path)
    dp = m.data_preprocessor
    return {
        'backbone': {k: (tuple(bb[k]) if k == 'out_indices' else bb.get(k, 'stream'))
                     for k in OFFICIAL_TABLE['backbone']},
        'feature pyramid': dict(out_channels=neck.out_channels,
                                scales=tuple(float(s) for s in neck.scales),
                                norm=neck.norm_cfg.type, num_outs=neck.num_outs),
        'rpn convs': rpn.get('num_convs', 1),
        'box head': [dict(type=h.type,
                          convs={'Shared2FCBBoxHead': 0, 'Shared4Conv1FCBBoxHead': 4}[h.type],
                          conv_channels=h.get('conv_out_channels', 256),
                          fcs={'Shared2FCBBoxHead': 2, 'Shared4Conv1FCBBoxHead': 1}[h.type],
                          fc_channels=h.fc_out_channels,
                          norm=(h.get('norm_cfg') or {}).get('type'))
                     for h in heads],
        'class-agnostic regression': [h.reg_class_agnostic for h in heads],
        'target stds': [tuple(round(s, 6) for s in h.bbox_coder.target_stds) for h in heads],
        'stage IoU': [(r.assigner.pos_iou_thr if r.assigner.pos_iou_thr == r.assigner.neg_iou_thr
                       else None) for r in m.train_cfg.rcnn],
        'box losses': dict(rpn=rpn.loss_bbox.type,
                           stages=tuple(h.loss_bbox.type for h in heads)),
        'mask head': dict(type=roi.mask_head.type, convs=roi.mask_head.num_convs,
                          conv_channels=roi.mask_head.conv_out_channels,
                          norm=(roi.mask_head.get('norm_cfg') or {}).get('type')),
        'amp': dict(type=ow.type, dtype=ow.get('dtype'), loss_scale=ow.get('loss_scale')),
        'optimizer': dict(type=opt.type, lr=opt.lr, betas=tuple(opt.betas),
                          weight_decay=opt.weight_decay),
        'layer decay rate': pw.layer_decay_rate,
        'layer decay scope': pw.get('layer_decay_scope', 'all'),
        'no weight decay': dict(flat_decay_mult=pw.get('flat_decay_mult', 0.0),
                                no_decay_leaves=tuple(pw.get('no_decay_leaves', ('default', )))),
        'iterations': cfg.train_cfg.max_iters,
        'warm-up': dict(start_factor=sched['LinearLR']['start_factor'],
                        end=sched['LinearLR']['end']),
        'steps': dict(milestones=list(sched['MultiStepLR']['milestones']),
                      gamma=sched['MultiStepLR']['gamma']),
        'gpus x batch': (gpus, cfg.train_dataloader.batch_size),
        'total batch': gpus * per_gpu if per_gpu == cfg.train_dataloader.batch_size else None,
        'train pipeline': _names(cfg.train_dataloader.dataset.pipeline),
        'test resize': dict(scale=tuple(resize[0]['scale']),
                            keep_ratio=resize[0]['keep_ratio']),
        'test padding': dict(pad_size_divisor=dp.pad_size_divisor,
                             pad_value=dp.get('pad_value', 0)),
        'pixel mean / std (RGB)': dict(mean=tuple(dp.mean), std=tuple(dp.std),
                                       bgr_to_rgb=dp.bgr_to_rgb),
    }


def _mismatches(path):
    cfg = load_config(path)
    actual = _actual(cfg, path)
    return [(row, want, actual[row]) for row, want in OFFICIAL_TABLE.items()
            if actual[row] != want]


def test_official_code_config_matches_the_official_table():
    bad = _mismatches(CONFIG)
    assert not bad, '\n'.join(f'{row}: official {want!r}, config {got!r}'
                              for row, want, got in bad)
    text = open(CONFIG).read()
    assert text.startswith(RECIPE), 'the first comment names the recipe'
    flat = ' '.join(text.split())
    for word in COMMENT_WORDS:
        assert word in flat, f'the comment does not name {word!r}'


def test_our_cascade_config_is_not_the_official_recipe():
    """The mmdet-default-heads config says so, points to the official-code one, quotes no
    published number as expected, and differs from the table where the spec says it does."""
    text = ' '.join(open(OURS).read().split())
    assert text.startswith('# Recipe: ours (mmdet default heads)')
    assert osp.basename(CONFIG) in text
    rows = {row for row, _, _ in _mismatches(OURS)}
    assert {'rpn convs', 'box head', 'mask head', 'amp', 'layer decay rate', 'no weight decay',
            'gpus x batch', 'test padding'} <= rows, rows


# ------------------------------------------------------------------ test-time padding
def _rand_img(h, w, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy()


def _preprocessor(cfg):
    from mmdet.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmdet'):
        return MODELS.build(copy.deepcopy(cfg.model.data_preprocessor))


def _resized(cfg, img):
    """The config's test-pipeline Resize applied to an (H, W, 3) image: (C, H, W) uint8."""
    from mmdet.registry import TRANSFORMS
    step = next(t for t in cfg.test_pipeline if t['type'] == 'Resize')
    with DefaultScope.overwrite_default_scope('mmdet'):
        resize = TRANSFORMS.build(copy.deepcopy(step))
    out = resize(dict(img=img, img_shape=img.shape[:2], ori_shape=img.shape[:2]))
    return torch.from_numpy(out['img']).permute(2, 0, 1).contiguous()


@pytest.mark.parametrize('batched', [False, True])
def test_test_images_are_padded_to_a_1024_square(batched):
    from mmdet.structures import DetDataSample
    cfg = load_config(CONFIG)
    pre = _preprocessor(cfg).eval()
    # W x H: 1024x683, 640x1024 (already at the test size) and 640x480 (resized to 1024x768)
    raw = [_rand_img(683, 1024, 0), _rand_img(1024, 640, 1), _rand_img(480, 640, 2)]
    imgs = [_resized(cfg, r) for r in raw]
    assert [tuple(i.shape[1:]) for i in imgs] == [(683, 1024), (1024, 640), (768, 1024)]
    groups = [imgs] if batched else [[i] for i in imgs]
    mean = torch.tensor(cfg.model.data_preprocessor.mean).view(3, 1, 1)
    std = torch.tensor(cfg.model.data_preprocessor.std).view(3, 1, 1)
    for group in groups:
        samples = [DetDataSample(metainfo=dict(img_shape=tuple(i.shape[1:]))) for i in group]
        out = pre(dict(inputs=list(group), data_samples=samples), False)
        x = out['inputs']
        assert tuple(x.shape) == (len(group), 3, 1024, 1024)
        for img, xi, s in zip(group, x, out['data_samples'], strict=True):
            h, w = img.shape[1:]
            assert s.batch_input_shape == (1024, 1024) and s.pad_shape == (1024, 1024)
            # zeros after normalisation, the image itself normalised (BGR -> RGB)
            assert (xi[:, h:] == 0).all() and (xi[:, :, w:] == 0).all()
            want = (img.flip(0).float() - mean) / std
            torch.testing.assert_close(xi[:, :h, :w], want)


def test_training_inputs_and_masks_are_padded_to_1024():
    """Training: a cropped LSJ image smaller than 1024 pads to 1024 x 1024 (divisor and
    BatchFixedSizePad agree), and its instance masks with it (``pad_mask``)."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    cfg = load_config(CONFIG)
    pre = _preprocessor(cfg).train()
    img = torch.from_numpy(_rand_img(600, 800, 3)).permute(2, 0, 1).contiguous()
    masks = torch.zeros(1, 600, 800, dtype=torch.uint8)
    masks[0, 100:200, 100:300] = 1
    s = DetDataSample(metainfo=dict(img_shape=(600, 800)))
    s.gt_instances = InstanceData(bboxes=torch.tensor([[100., 100., 300., 200.]]),
                                  labels=torch.tensor([3]),
                                  masks=BitmapMasks(masks.numpy(), 600, 800))
    out = pre(dict(inputs=[img], data_samples=[s]), True)
    assert tuple(out['inputs'].shape) == (1, 3, 1024, 1024)
    m = out['data_samples'][0].gt_instances.masks
    assert (m.height, m.width) == (1024, 1024) and int(m.masks.sum()) == 100 * 200


# ------------------------------------------------------------------ the detector, small
TINY_ARCH = dict(embed_dims=32, num_layers=4, d_state=8)     # as tests/test_configs.py
SIZE = 128


def _small_detector(arch=TINY_ARCH, out_indices=(3, )):
    """The config's detector with the tiny backbone at 128 x 128 (square pad to 128), every
    head as configured."""
    from mmdet.registry import MODELS
    cfg = load_config(CONFIG)
    m = copy.deepcopy(cfg.model)
    m.backbone.update(arch=arch, img_size=SIZE, init_cfg=None, out_indices=out_indices)
    m.neck.in_channels = arch['embed_dims']
    m.data_preprocessor.pad_size_divisor = SIZE
    for aug in m.data_preprocessor.batch_augments:
        aug.size = (SIZE, SIZE)
    m.test_cfg.rpn.update(nms_pre=100, max_per_img=50)
    m.test_cfg.rcnn.max_per_img = 10
    with DefaultScope.overwrite_default_scope('mmdet'):
        return MODELS.build(m)


def _is_ln2d(module):
    return type(module).__name__ == 'LayerNorm2d' and module.weight.shape == (256, )


def test_small_detector_has_the_official_heads():
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    model = _small_detector()
    assert type(model).__name__ == 'CascadeRCNN' and type(model.backbone).__name__ == 'Vim'
    assert model.backbone.tap == 'stream' and not model.backbone.final_norm
    # RPN: two 3x3 convs of 256 with ReLU, no norm (detectron2 StandardRPNHead conv_dims [-1, -1])
    convs = list(model.rpn_head.rpn_conv)
    assert len(convs) == 2
    for c in convs:
        assert c.conv.kernel_size == (3, 3) and c.conv.out_channels == 256
        assert c.norm is None and c.activate is not None
    # three box heads: 4 convs (3x3, 256, no bias) each followed by LN2d and ReLU, 1 fc of 1024
    heads = model.roi_head.bbox_head
    assert len(heads) == 3
    for k, h in enumerate(heads):
        assert type(h).__name__ == 'Shared4Conv1FCBBoxHead'
        assert len(h.shared_convs) == 4 and len(h.shared_fcs) == 1
        for c in h.shared_convs:
            assert c.conv.kernel_size == (3, 3) and c.conv.out_channels == 256
            assert c.conv.bias is None and _is_ln2d(c.norm) and c.activate is not None
            assert c.order == ('conv', 'norm', 'act')
        assert h.shared_fcs[0].out_features == 1024 and h.shared_fcs[0].in_features == 256 * 49
        assert h.reg_class_agnostic and h.fc_reg.out_features == 4
        assert h.fc_cls.out_features == 81
        a, b = BOX_WEIGHTS[k]
        torch.testing.assert_close(torch.tensor(h.bbox_coder.stds, dtype=torch.float64),
                                   1 / torch.tensor([a, a, b, b], dtype=torch.float64))
    # the mask head(s) (mmdet's CascadeRoIHead: one per stage): 4 convs + LN2d, deconv, logits
    for mh in model.roi_head.mask_head:
        assert type(mh).__name__ == 'FCNMaskHead' and len(mh.convs) == 4
        for c in mh.convs:
            assert c.conv.out_channels == 256 and c.conv.bias is None and _is_ln2d(c.norm)
        assert mh.upsample is not None and mh.conv_logits.out_channels == 80
    # losses (train) and predictions (test) run
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (3, SIZE, SIZE), generator=g, dtype=torch.uint8)
    masks = torch.zeros(2, SIZE, SIZE, dtype=torch.uint8)
    masks[0, 10:60, 20:90] = 1
    masks[1, 70:120, 40:100] = 1
    s = DetDataSample(metainfo=dict(img_id=0, img_shape=(SIZE, SIZE), ori_shape=(SIZE, SIZE),
                                    scale_factor=(1.0, 1.0)))
    s.gt_instances = InstanceData(bboxes=torch.tensor([[20., 10., 90., 60.],
                                                       [40., 70., 100., 120.]]),
                                  labels=torch.tensor([1, 5]),
                                  masks=BitmapMasks(masks.numpy(), SIZE, SIZE))
    with DefaultScope.overwrite_default_scope('mmdet'):
        model.train()
        data = model.data_preprocessor(dict(inputs=[img], data_samples=[s]), True)
        losses = model(**data, mode='loss')
        names = {k for k in losses}
        assert {'loss_rpn_cls', 'loss_rpn_bbox', 's0.loss_bbox', 's2.loss_bbox',
                's0.loss_mask', 's2.loss_mask'} <= names, sorted(names)
        total = sum(v.sum() if torch.is_tensor(v) else sum(x.sum() for x in v)
                    for k, v in losses.items() if 'loss' in k)
        assert torch.isfinite(total)
        model.eval()
        with torch.no_grad():
            preds = model.test_step(dict(inputs=[img], data_samples=[DetDataSample(
                metainfo=dict(img_id=0, img_shape=(SIZE, SIZE), ori_shape=(SIZE, SIZE),
                              scale_factor=(1.0, 1.0)))]))
    inst = preds[0].pred_instances
    assert inst.bboxes.shape[-1] == 4 and inst.masks.shape[1:] == (SIZE, SIZE)


# ------------------------------------------------------------------ optimizer groups
def official_vim_lr_factor(name, lr_decay_rate=0.837, num_layers=24):
    """hustvl/Vim det/detectron2/modeling/backbone/vim.py ``get_vim_lr_decay_rate``, re-stated
    (the official names are ``backbone.net.*``; ours ``backbone.*``: the rule only looks for
    ``.pos_embed``, ``.patch_embed`` and ``.layers.<i>`` after a ``backbone`` prefix)."""
    layer_id = num_layers + 1
    if name.startswith('backbone'):
        if '.pos_embed' in name or '.patch_embed' in name:
            layer_id = 0
        elif '.layers.' in name and '.residual.' not in name:
            layer_id = int(name[name.find('.layers.'):].split('.')[2]) + 1
    return lr_decay_rate ** (num_layers + 1 - layer_id)


def official_weight_decay(name, base_wd):
    """detectron2 ``get_default_optimizer_params(weight_decay_norm=0.0, overrides={'pos_embed':
    {'weight_decay': 0.0}})`` on the official model: the norm rule exempts modules of the
    torch.nn norm classes only, and the official model's norms are detectron2's LayerNorm and
    mamba_ssm's RMSNorm (neither is one), so only the leaf ``pos_embed`` is exempt."""
    return 0.0 if name.rsplit('.', 1)[-1] == 'pos_embed' else base_wd


def test_optimizer_groups_follow_the_official_rule():
    from mmengine.optim import build_optim_wrapper
    cfg = load_config(CONFIG)
    model = _small_detector(arch=dict(embed_dims=32, num_layers=24, d_state=8),
                            out_indices=(23, )).train()
    ow = copy.deepcopy(cfg.optim_wrapper)
    if not torch.cuda.is_available():
        # mmengine's AmpOptimWrapper asserts a GPU (or NPU/MLU/MUSA) at build
        with DefaultScope.overwrite_default_scope('mmdet'), pytest.raises(AssertionError,
                                                                           match='only available'):
            build_optim_wrapper(model, copy.deepcopy(ow))
    ow.type = 'OptimWrapper'
    ow.pop('dtype'), ow.pop('loss_scale')
    with DefaultScope.overwrite_default_scope('mmdet'):
        wrapper = build_optim_wrapper(model, ow)
    opt = cfg.optim_wrapper.optimizer
    where = {}
    for g in wrapper.optimizer.param_groups:
        for p in g['params']:
            assert id(p) not in where
            where[id(p)] = (g['lr'], g['weight_decay'])
    checked, seen = 0, set()
    for name, p in model.named_parameters():
        if not p.requires_grad:      # the unused class token and norm_f
            assert id(p) not in where and name in ('backbone.cls_token', 'backbone.norm_f.weight')
            continue
        want = (opt.lr * official_vim_lr_factor(name), official_weight_decay(name, 0.1))
        got = where[id(p)]
        assert math.isclose(got[0], want[0], rel_tol=1e-9) and got[1] == want[1], \
            f'{name}: official (lr, wd) {want}, ours {got}'
        checked += 1
        leaf = name.rsplit('.', 1)[-1]
        if got[1] > 0 and (p.ndim == 1 or leaf in ('A_log', 'A_b_log', 'D', 'D_b')):
            seen.add(leaf if leaf in ('A_log', 'A_b_log', 'D', 'D_b') else '1-D')
    assert checked == len(where)
    # decayed as in the official run: 1-D parameters (norm weights, biases), D, A_log
    assert {'1-D', 'A_log', 'D'} <= seen, seen
    named = dict(model.named_parameters())
    rate = cfg.optim_wrapper.paramwise_cfg.layer_decay_rate
    assert where[id(named['backbone.pos_embed'])] == pytest.approx((1e-4 * rate ** 25, 0.0))
    assert where[id(named['backbone.patch_embed.proj.weight'])] == pytest.approx(
        (1e-4 * rate ** 25, 0.1))
    assert where[id(named['backbone.layers.0.norm.weight'])] == pytest.approx(
        (1e-4 * rate ** 24, 0.1))
    assert where[id(named['backbone.layers.23.mixer.A_log'])] == pytest.approx((1e-4 * rate, 0.1))
    ln = next(n for n, m in model.roi_head.bbox_head[0].named_modules() if _is_ln2d(m))
    assert where[id(named[f'roi_head.bbox_head.0.{ln}.weight'])] == pytest.approx((1e-4, 0.1))
