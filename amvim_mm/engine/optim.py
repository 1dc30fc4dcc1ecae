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
base rate. ``paramwise_cfg`` keys:

* ``layer_decay_rate``: a number in (0, 1] (default 1.0 = no decay).
* ``layer_decay_scope``: ``'all'`` (default: every depth as above) or ``'embeddings'`` (only
  the embeddings are decayed, at ``rate ** (n - 1)``; blocks train at the base rate): the
  rule the official Vim segmentation code actually runs (see
  :mod:`amvim_mm.models.skeleton.layer_decay`).
* ``flat_decay_mult``: weight-decay factor of 1-D parameters (norm weights, biases, ``D``);
  default 0.0.
* ``no_decay_leaves``: fnmatch patterns on a parameter's leaf name with no weight decay;
  default ``('pos_embed', 'cls_token', 'A_*', 'A*_log', 'D_*', 'D', 'Ds')`` (as in the
  reference classification code); ``()`` decays them all.
* ``no_decay_names``: substrings of full parameter names with no weight decay (added to the
  rule).

The official dense recipes, as their code ran them: Vim segmentation
``dict(layer_decay_rate=0.92, layer_decay_scope='embeddings', flat_decay_mult=0.0,
no_decay_leaves=())``; Vim detection (detectron2) ``dict(layer_decay_rate=0.837,
flat_decay_mult=1.0, no_decay_leaves=('pos_embed', ))``.

Configs written for mmseg's ``LayerDecayOptimizerConstructor`` carry ``num_layers`` and
``decay_type`` in ``paramwise_cfg``: both are accepted here when they agree with the backbone
(``num_layers`` = its depth, ``decay_type='layer_wise'``); the depth itself always comes from the
backbone. mmseg's and mmdet's own constructors work with our backbones too (see
:mod:`amvim_mm.models.skeleton.layer_decay`).
"""
from __future__ import annotations

import math
from typing import List

import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.optim import DefaultOptimWrapperConstructor
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS

from amvim_mm.errors import ConfigError
from amvim_mm.models.skeleton.layer_decay import (DEFAULT_NO_DECAY_LEAVES, NoDecayRule,
                                                  checked_rate, layer_decay_param_groups,
                                                  unwrap_backbone)


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """``paramwise_cfg``: ``layer_decay_rate``, ``layer_decay_scope``, ``flat_decay_mult``,
    ``no_decay_leaves``, ``no_decay_names`` (plus mmseg's ``num_layers`` / ``decay_type``,
    checked; see the module docstring)."""

    def add_params(self, params: List[dict], module: nn.Module, **kwargs) -> None:
        name = 'LayerDecayOptimWrapperConstructor'
        cfg = dict(self.paramwise_cfg)
        rate = checked_rate(name, 'layer_decay_rate', cfg.pop('layer_decay_rate', 1.0))
        scope = cfg.pop('layer_decay_scope', 'all')
        rule = _no_decay_rule(name, cfg)
        num_layers = cfg.pop('num_layers', None)
        decay_type = cfg.pop('decay_type', 'layer_wise')
        if cfg:
            raise ConfigError(f'{name}: unknown paramwise_cfg keys {sorted(cfg)}; use '
                              'layer_decay_rate, layer_decay_scope, flat_decay_mult, '
                              'no_decay_leaves and no_decay_names')
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
        groups = layer_decay_param_groups(module, self.base_lr, self.base_wd, rate,
                                          scope=scope, rule=rule)
        MMLogger.get_current_instance().info(
            f'LayerDecayOptimWrapperConstructor: {len(groups)} groups, decay rate {rate} '
            f'({scope}), {rule}')
        params.extend(groups)


def _no_decay_rule(owner: str, cfg: dict) -> NoDecayRule:
    """The weight-decay rule of ``paramwise_cfg`` (its keys popped from ``cfg``)."""
    mult = cfg.pop('flat_decay_mult', 0.0)
    try:
        mult = float(mult)
    except (TypeError, ValueError):
        raise ConfigError(f'{owner}: flat_decay_mult must be a number >= 0, got {mult!r}') from None
    if not (math.isfinite(mult) and mult >= 0.0):
        raise ConfigError(f'{owner}: flat_decay_mult must be a finite number >= 0, got {mult!r}')
    lists = {}
    for key, default in (('no_decay_leaves', DEFAULT_NO_DECAY_LEAVES), ('no_decay_names', ())):
        value = cfg.pop(key, default)
        if isinstance(value, str) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f'{owner}: {key} must be a list of strings, got {value!r}')
        lists[key] = tuple(value)
    return NoDecayRule(flat_decay_mult=mult, leaves=lists['no_decay_leaves'],
                       names=lists['no_decay_names'])
