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
``no_decay_names``.

Configs written for mmseg's ``LayerDecayOptimizerConstructor`` (which picks layers by backbone
class name and fails with a bare ``NotImplementedError`` for ours) carry ``num_layers`` and
``decay_type`` in ``paramwise_cfg``: both are accepted here when they agree with the backbone
(``num_layers`` = its depth, ``decay_type='layer_wise'``); the depth itself always comes from the
backbone.
"""
from __future__ import annotations

from typing import List

import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.model import is_model_wrapper
from mmengine.optim import DefaultOptimWrapperConstructor
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS

from amvim_mm.errors import ConfigError

NO_DECAY_SUFFIXES = ('pos_embed', 'cls_token')


def _no_decay(name: str, param, extra: List[str]) -> bool:
    leaf = name.rsplit('.', 1)[-1]
    return (param.ndim <= 1 or leaf in NO_DECAY_SUFFIXES or leaf.startswith('A_')
            or (leaf.startswith('A') and leaf.endswith('_log')) or leaf.startswith('D_')
            or leaf == 'D' or any(e in name for e in extra))


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
        model = module.module if is_model_wrapper(module) else module
        backbone = getattr(model, 'backbone', model)
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
        prefix = 'backbone.' if backbone is not model else ''
        groups = {}
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            if name.startswith(prefix):
                depth, num = backbone.get_layer_depth(name, prefix)
            else:
                depth, num = 1, 2  # heads and necks: base rate
            scale = rate ** (num - 1 - depth)
            decay = 0.0 if _no_decay(name, param, extra) else self.base_wd
            key = (depth if name.startswith(prefix) else 'head', decay)
            g = groups.setdefault(key, dict(params=[], lr=self.base_lr * scale,
                                            weight_decay=decay, lr_scale=scale, names=[]))
            g['params'].append(param)
            g['names'].append(name)
        MMLogger.get_current_instance().info(
            f'LayerDecayOptimWrapperConstructor: {len(groups)} groups, decay rate {rate}')
        for g in groups.values():
            g.pop('names')
            params.append(g)
