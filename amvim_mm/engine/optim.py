"""Layer-wise learning-rate decay driven by the backbone's ``get_layer_depth``.

One constructor for mmseg, mmdet and mmpretrain configs (registered in mmengine's root
``OPTIM_WRAPPER_CONSTRUCTORS``)::

    optim_wrapper = dict(
        type='OptimWrapper',
        optimizer=dict(type='AdamW', lr=6e-5, weight_decay=0.01),
        constructor='LayerDecayOptimWrapperConstructor',
        paramwise_cfg=dict(layer_decay_rate=0.9))

A parameter at layer depth ``d`` of ``n`` (``backbone.get_layer_depth``) gets
``lr * layer_decay_rate ** (n - 1 - d)``; parameters outside the backbone (neck, heads) get the
base rate. No weight decay for 1-D parameters (norms, biases), the position embedding, the class
token and the SSM's ``A_log``/``D`` (as in the reference training code), plus any name listed in
``no_decay_names`` (see :mod:`amvim_mm.models.backbones.layer_decay`, which builds the groups).

Configs written for mmseg's ``LayerDecayOptimizerConstructor`` carry ``num_layers`` and
``decay_type`` in ``paramwise_cfg``: both are accepted here when they agree with the backbone
(``num_layers`` = its depth, ``decay_type='layer_wise'``); the depth itself always comes from the
backbone. mmseg's and mmdet's own constructors work with our backbones too (see
:mod:`amvim_mm.models.backbones.layer_decay`).
"""
from __future__ import annotations

from typing import List

import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.optim import DefaultOptimWrapperConstructor
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS

from amvim_mm.errors import ConfigError
from amvim_mm.models.backbones.layer_decay import layer_decay_param_groups, unwrap_backbone


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """``paramwise_cfg``: ``layer_decay_rate`` (default 1.0 = no decay) and ``no_decay_names``
    (plus mmseg's ``num_layers`` / ``decay_type``, checked, see the module docstring)."""

    def add_params(self, params: List[dict], module: nn.Module, **kwargs) -> None:
        name = 'LayerDecayOptimWrapperConstructor'
        cfg = dict(self.paramwise_cfg)
        rate = float(cfg.pop('layer_decay_rate', 1.0))
        extra = list(cfg.pop('no_decay_names', []))
        num_layers = cfg.pop('num_layers', None)
        decay_type = cfg.pop('decay_type', 'layer_wise')
        if cfg:
            raise ConfigError(f'{name}: unknown paramwise_cfg keys {sorted(cfg)}; use '
                              'layer_decay_rate and no_decay_names')
        _, backbone, _ = unwrap_backbone(module)
        if not hasattr(backbone, 'get_layer_depth'):
            raise ConfigError(f'{type(backbone).__name__} has no get_layer_depth(); layer-wise '
                              'decay needs a Vim-family backbone')
        if decay_type != 'layer_wise':
            raise ConfigError(f'{name}: decay_type={decay_type!r} is not supported; the Vim '
                              "family has one stage (use 'layer_wise' or leave it out)")
        depth = getattr(backbone, 'num_layers', None)
        if num_layers is not None and num_layers != depth:
            raise ConfigError(f'{name}: paramwise_cfg num_layers={num_layers} but the backbone '
                              f'has {depth} layers; drop num_layers (the depth comes from the '
                              'backbone)')
        groups = layer_decay_param_groups(module, self.base_lr, self.base_wd, rate, extra)
        MMLogger.get_current_instance().info(
            f'LayerDecayOptimWrapperConstructor: {len(groups)} groups, decay rate {rate}')
        params.extend(groups)
