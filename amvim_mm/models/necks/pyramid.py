"""Necks that turn a plain (single-scale) backbone into a feature pyramid.

* :class:`PlainPyramidNeck`: Vim's segmentation pyramid, one map per ``out_index`` resized by
  ``x4`` (two transposed convs with norm + GELU between), ``x2`` (one transposed conv), ``x1``
  and ``x0.5`` (max-pool), feeding UperNet.
* :class:`SimpleFeaturePyramid`: ViTDet's pyramid from the last map (scales 4, 2, 1, 0.5, each
  followed by 1x1 and 3x3 convs with LayerNorm to ``out_channels``) plus an extra max-pooled
  level, feeding Mask R-CNN / Cascade Mask R-CNN.

No SyncBN is hard-coded: norms come from ``norm_cfg`` (mmcv's ``build_norm_layer``), so the
same config runs on one GPU or a CPU (``BN``) and on several (``SyncBN``, set in the config).
mmcv is imported when a neck is built, not when ``amvim_mm`` is imported.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from amvim_mm.errors import ConfigError
from amvim_mm.registry import MODELS

SCALES = (4.0, 2.0, 1.0, 0.5)


@MODELS.register_module(name='LN2d')
class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a (B, C, H, W) map (ViTDet's ``LN2d``)."""

    def __init__(self, num_channels: int, eps: float = 1e-6, **kwargs) -> None:
        super().__init__(num_channels, eps=eps, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight,
                            self.bias, self.eps).permute(0, 3, 1, 2)


def _norm(norm_cfg: dict, channels: int) -> nn.Module:
    from mmcv.cnn import build_norm_layer
    return build_norm_layer(norm_cfg, channels)[1]


def _check_scales(scales: Sequence[float], name: str) -> Tuple[float, ...]:
    scales = tuple(float(s) for s in scales)
    bad = [s for s in scales if s not in SCALES]
    if bad or not scales:
        raise ConfigError(f'{name}: scales must be taken from {SCALES}, got {scales}')
    return scales


@MODELS.register_module()
class PlainPyramidNeck(BaseModule):
    """Vim's 4-level pyramid for UperNet: map ``i`` is resized by ``scales[i]``.

    Args:
        in_channels: backbone width D (all levels keep D channels).
        scales: one factor per input map, from (4, 2, 1, 0.5); default (4, 2, 1, 0.5) for patch
            16. (For patch/stride 8 use (2, 1, 0.5, ...) with fewer levels or your own choice.)
        norm_cfg: norm between the two transposed convs of the x4 branch.
        in_norm_cfg: a norm applied to every input map before its resize (None: none), e.g.
            ``dict(type='LN2d', eps=1e-5)`` for LocalMamba's per-tap LayerNorms
            (``outnorm_{i}``, ``nn.LayerNorm(D)`` over the channels of each token).
    """

    def __init__(self, in_channels: int, scales: Sequence[float] = SCALES,
                 norm_cfg: dict = dict(type='BN', requires_grad=True),
                 in_norm_cfg: Optional[dict] = None,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.scales = _check_scales(scales, 'PlainPyramidNeck')
        D = in_channels
        self.in_norms = None if in_norm_cfg is None else nn.ModuleList(
            _norm(in_norm_cfg, D) for _ in self.scales)
        ops = []
        for s in self.scales:
            if s == 4.0:
                ops.append(nn.Sequential(
                    nn.ConvTranspose2d(D, D, 2, 2), _norm(norm_cfg, D), nn.GELU(),
                    nn.ConvTranspose2d(D, D, 2, 2)))
            elif s == 2.0:
                ops.append(nn.ConvTranspose2d(D, D, 2, 2))
            elif s == 1.0:
                ops.append(nn.Identity())
            else:
                ops.append(nn.MaxPool2d(2, 2))
        self.ops = nn.ModuleList(ops)

    def forward(self, inputs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
        inputs = list(inputs)
        if len(inputs) == 1:
            inputs = inputs * len(self.ops)
        if len(inputs) != len(self.ops):
            raise ConfigError(f'PlainPyramidNeck has {len(self.ops)} scales but got '
                              f'{len(inputs)} feature maps; set the backbone out_indices to '
                              f'{len(self.ops)} blocks')
        if self.in_norms is not None:
            inputs = [norm(x) for norm, x in zip(self.in_norms, inputs)]
        return tuple(op(x) for op, x in zip(self.ops, inputs))


@MODELS.register_module()
class SimpleFeaturePyramid(BaseModule):
    """ViTDet's simple feature pyramid from the last backbone map.

    Args:
        in_channels: backbone width D.
        out_channels: channels of every level (256).
        scales: from (4, 2, 1, 0.5).
        norm_cfg: norm of the lateral/output convs and of the x4 branch (``LN2d``).
        num_outs: levels returned; one more than ``len(scales)`` adds a max-pooled level
            (stride 64 for patch 16), as Mask R-CNN's RPN expects.
    """

    def __init__(self, in_channels: int, out_channels: int = 256,
                 scales: Sequence[float] = SCALES, norm_cfg: dict = dict(type='LN2d'),
                 num_outs: int = 5, init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.scales = _check_scales(scales, 'SimpleFeaturePyramid')
        if num_outs not in (len(self.scales), len(self.scales) + 1):
            raise ConfigError(f'SimpleFeaturePyramid: num_outs must be {len(self.scales)} or '
                              f'{len(self.scales) + 1}, got {num_outs}')
        self.num_outs = num_outs
        D = in_channels
        self.stages = nn.ModuleList()
        for s in self.scales:
            if s == 4.0:
                layers: List[nn.Module] = [nn.ConvTranspose2d(D, D // 2, 2, 2),
                                           _norm(norm_cfg, D // 2), nn.GELU(),
                                           nn.ConvTranspose2d(D // 2, D // 4, 2, 2)]
                c = D // 4
            elif s == 2.0:
                layers, c = [nn.ConvTranspose2d(D, D // 2, 2, 2)], D // 2
            elif s == 1.0:
                layers, c = [], D
            else:
                layers, c = [nn.MaxPool2d(2, 2)], D
            layers += [nn.Conv2d(c, out_channels, 1, bias=False), _norm(norm_cfg, out_channels),
                       nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
                       _norm(norm_cfg, out_channels)]
            self.stages.append(nn.Sequential(*layers))

    def forward(self, inputs: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
        x = inputs[-1]
        outs = [stage(x) for stage in self.stages]
        if self.num_outs > len(outs):
            outs.append(F.max_pool2d(outs[-1], kernel_size=1, stride=2))
        return tuple(outs)
