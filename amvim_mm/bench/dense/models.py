"""The dense suite's models: the ADE20K UperNet, the COCO backbone + feature pyramid, the
ImageNet classifier, each for ours and for the peer (mmseg's ViT)."""
from __future__ import annotations

import copy
import os.path as osp
from typing import Tuple

import torch
import torch.nn as nn

from .config import (ADE_CONFIGS, COCO_BACKBONE, COCO_NECK, IN1K_BACKBONE, IN1K_HEAD,
                     IN1K_OPTIM, DenseSizes)


class BackboneNeck(nn.Module):
    """Backbone + neck (the detector's feature extractor without its heads)."""

    def __init__(self, backbone: nn.Module, neck: nn.Module) -> None:
        super().__init__()
        self.backbone, self.neck = backbone, neck

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(self.neck(self.backbone(x)))


class ClsTokenClassifier(nn.Module):
    """Backbone + linear head on the class token; ``peer=True``: an mmseg ViT built with
    ``output_cls_token=True`` (its last output is ``[feature map, class token]``)."""

    def __init__(self, backbone: nn.Module, width: int, num_classes: int,
                 peer: bool = False) -> None:
        super().__init__()
        self.backbone, self.peer = backbone, peer
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.backbone(x)[-1]
        return self.head(out[1] if self.peer else out)


def _peer_backbone(sizes: DenseSizes, img_size: int, out_indices: Tuple[int, ...],
                   **extra) -> dict:
    """mmseg's VisionTransformer at the peer's size (DeiT-T on the GPU), settings of mmseg's
    own ``upernet_vit-b16_ln_mln`` base; drop path as our dense configs (0.1); ``extra``
    overrides."""
    cfg = dict(type='VisionTransformer', img_size=(img_size, img_size), patch_size=16,
               in_channels=3, mlp_ratio=4, out_indices=out_indices, qkv_bias=True,
               drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.1, with_cls_token=True,
               norm_cfg=dict(type='LN', eps=1e-6), act_cfg=dict(type='GELU'),
               final_norm=False, norm_eval=False, interpolate_mode='bicubic', **sizes.peer)
    cfg.update(extra)
    return cfg


def quarter_indices(depth: int) -> Tuple[int, ...]:
    """Our Vim-T configs' out_indices (5, 11, 17, 23) of 24 blocks, for ``depth`` blocks."""
    return tuple(depth * (i + 1) // 4 - 1 for i in range(4))


def ours_depth(sizes: DenseSizes) -> int:
    from amvim_mm.models.vim.vim import Vim
    return Vim.arch_zoo[sizes.arch]['num_layers']


def ours_width(sizes: DenseSizes) -> int:
    from amvim_mm.models.vim.vim import Vim
    return Vim.arch_zoo[sizes.arch]['embed_dims']


def _seg_registry():
    """mmseg's MODELS with every mmseg module registered and 'mmseg' the default scope."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    init_default_scope('mmseg')
    return MODELS


def ade_config(model: str, sizes: DenseSizes, root: str):
    """The ADE20K config of ``model`` ('vim', 'amvim', 'vim-segmenter', or 'peer': the Vim
    UperNet with the peer backbone), without pretrained weights; tiny widths for the smoke
    sizes."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(root, ADE_CONFIGS['vim' if model == 'peer' else model]))
    m = cfg.model
    m.pretrained = None
    m.pop('data_preprocessor', None)   # inputs are made normalised; no data work is timed
    crop = sizes.ade_crop
    m.test_cfg.update(crop_size=(crop, crop), stride=(sizes.ade_stride, sizes.ade_stride))
    if model == 'peer':
        m.backbone = _peer_backbone(sizes, crop, quarter_indices(sizes.peer['num_layers']))
        width = sizes.peer['embed_dims']
    else:
        m.backbone.update(img_size=crop, init_cfg=None)
        if sizes.arch != 'tiny':
            m.backbone.update(arch=sizes.arch)
            if model != 'vim-segmenter':
                m.backbone.update(out_indices=quarter_indices(ours_depth(sizes)))
        width = ours_width(sizes)
    if model == 'vim-segmenter':      # the mask transformer on the last block's tokens
        if sizes.arch != 'tiny':
            m.decode_head.update(in_channels=width, channels=width, embed_dims=width,
                                 num_heads=2)
        return cfg
    # the same neck and heads for every UperNet (192 wide on the GPU, as the configs say)
    m.neck.in_channels = width
    m.decode_head.in_channels = [width] * 4
    m.auxiliary_head.in_channels = width
    if sizes.arch != 'tiny':
        m.decode_head.channels = m.auxiliary_head.channels = 16
    return cfg


def build_ade(model: str, sizes: DenseSizes, root: str, device: str):
    """(UperNet, optimizer-wrapper config) of ``model``; the peer's AdamW has one parameter
    group (the layer-decay constructor needs a backbone with ``get_layer_depth``)."""
    from mmengine.model import revert_sync_batchnorm
    registry = _seg_registry()
    cfg = ade_config(model, sizes, root)
    net = revert_sync_batchnorm(registry.build(cfg.model)).to(device)
    optim = copy.deepcopy(cfg.optim_wrapper)
    if model == 'peer':
        optim = dict(type='OptimWrapper', optimizer=optim['optimizer'])
    return net, optim


def build_coco(model: str, sizes: DenseSizes, device: str) -> nn.Module:
    """The Mask R-CNN configs' backbone + simple feature pyramid (:data:`COCO_BACKBONE`)."""
    from amvim_mm.registry import MODELS
    res = sizes.coco_res
    if model == 'peer':
        depth = sizes.peer['num_layers']
        _seg_registry()
        from mmseg.registry import MODELS as SEG
        backbone = SEG.build(_peer_backbone(sizes, res, (depth - 1, )))
        width = sizes.peer['embed_dims']
    else:
        cfg = dict(COCO_BACKBONE, type='AMVim' if model == 'amvim' else 'Vim', img_size=res)
        if sizes.arch != 'tiny':
            cfg.update(arch=sizes.arch, out_indices=(ours_depth(sizes) - 1, ))
        backbone = MODELS.build(cfg)
        width = ours_width(sizes)
    neck = MODELS.build(dict(COCO_NECK, in_channels=width))
    return BackboneNeck(backbone, neck).to(device)


def build_in1k(model: str, sizes: DenseSizes, device: str):
    """(classifier, optimizer-wrapper config): the AMVim-T fine-tuning recipe
    (:data:`IN1K_BACKBONE`, :data:`IN1K_OPTIM`); the peer gets the same AdamW in one group."""
    from amvim_mm.registry import MODELS
    res, optim = sizes.in1k_res, copy.deepcopy(IN1K_OPTIM)
    if model == 'peer':
        depth = sizes.peer['num_layers']
        _seg_registry()
        from mmseg.registry import MODELS as SEG
        # the classifier input is normalised, as ours (final_norm)
        backbone = SEG.build(_peer_backbone(sizes, res, (depth - 1, ), output_cls_token=True,
                                            final_norm=True))
        net = ClsTokenClassifier(backbone, sizes.peer['embed_dims'], IN1K_HEAD['num_classes'],
                                 peer=True)
        optim = dict(type='OptimWrapper', optimizer=optim['optimizer'])
    else:
        cfg = dict(IN1K_BACKBONE, type='AMVim' if model == 'amvim' else 'Vim', img_size=res)
        if sizes.arch != 'tiny':
            cfg['arch'] = sizes.arch
        net = ClsTokenClassifier(MODELS.build(cfg), ours_width(sizes),
                                 IN1K_HEAD['num_classes'])
    return net.to(device), optim
