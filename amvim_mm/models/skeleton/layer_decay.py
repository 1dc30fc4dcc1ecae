"""Layer-wise learning-rate decay from a backbone's ``get_layer_depth``: the parameter groups,
and mmseg's / mmdet's own decay constructors taught our backbones.

A parameter at layer depth ``d`` of ``n`` (``backbone.get_layer_depth(name, 'backbone.')``) gets
``lr * rate ** (n - 1 - d)`` (the convention of mmseg's, mmdet's and mmpretrain's constructors);
parameters outside the backbone (neck, heads) get the base rate. With ``scope='embeddings'``
only the embeddings (depth 0) are decayed, at ``rate ** (n - 1)``, and every block trains at the
base rate: what the official Vim segmentation code runs (its BEiT constructor assigns depths to
``backbone.blocks.*``, a name the Vim backbone does not have, so ``backbone.layers.*`` fall to
the last depth).

Weight decay (:class:`NoDecayRule`): by default none for 1-D parameters (norms, biases, ``D``),
the position embedding, the class token and the SSM's ``A_log``/``D`` (as in the reference
classification code), plus any name in ``no_decay_names``; the official dense recipes decay
more (``flat_decay_mult``, ``no_decay_leaves``).

**mmseg's ``LayerDecayOptimizerConstructor`` / ``LearningRateDecayOptimizerConstructor`` and
mmdet 3.3.0's ``LearningRateDecayOptimizerConstructor``** pick layers by the backbone's class
name (ConvNeXt, BEiT, MAE) and stop with a bare ``NotImplementedError`` for any other.
**Decision**: :func:`teach_upstream_layer_decay` registers, in those libraries' own
``OPTIM_WRAPPER_CONSTRUCTORS`` registries and under the same names (mmengine's public registry
API, ``force=True``), a subclass of each constructor whose ``add_params`` uses
``get_layer_depth`` for a backbone of this project and is the library's own, unchanged, for
every other backbone (ConvNeXt and BEiT users see no difference). Why not a check that only
turns the ``NotImplementedError`` into a one-line error: it needs the same registry entry (the
library's lookup by name finds its own class first, and nothing of ours runs before its
``add_params`` raises), and with the entry in place the configs can simply work.

When: at the build of each of our backbones (the backbones call it), not at ``import
amvim_mm``. The package imports mmengine only (mmseg and mmdet are optional, and a config's
``custom_imports`` may import ``amvim_mm`` before any library's registry exists); a model is
always built before its optimizer (mmengine's ``Runner``), in the process that builds both,
and a library's registry exists by then if that library builds the model. Only libraries whose
registry is already there are touched (nothing is imported that the process did not already
use, besides the library's own optimizer module, which its registry imports on first lookup
anyway); each registry is taught once per process.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Dict, Iterable, List, Optional, Sequence, Set

import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.model import is_model_wrapper
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS

from amvim_mm.errors import ConfigError
from .checkpoint_guard import CheckpointGuard

#: leaf names kept out of weight decay by default (fnmatch patterns): the position embedding,
#: the class token and the SSM's A / D parameters of every family (A_log, A_b_log, A_logs, D,
#: D_b, Ds...), as the reference classification code does
DEFAULT_NO_DECAY_LEAVES = ('pos_embed', 'cls_token', 'A_*', 'A*_log', 'D_*', 'D', 'Ds')
#: the libraries (registry scopes) and constructor names taught by teach_upstream_layer_decay
UPSTREAM_SCOPES = ('mmseg', 'mmdet')
UPSTREAM_NAMES = ('LearningRateDecayOptimizerConstructor', 'LayerDecayOptimizerConstructor')
#: decay types of the upstream constructors that mean "one learning rate per layer depth"
LAYER_WISE_TYPES = ('layer_wise', 'layer_wise_vit')
#: what layer-wise decay acts on: every depth of the backbone, or its embeddings only
DECAY_SCOPES = ('all', 'embeddings')

_taught: Set[str] = set()


@dataclass(frozen=True)
class NoDecayRule:
    """Which parameters get how much weight decay.

    ``flat_decay_mult``: multiplier of the weight decay of 1-D parameters (norm weights, biases,
    ``D``); 0 keeps them out (the default, as the reference classification code and the official
    Vim segmentation code do), 1 decays them (detectron2's rule in the official Vim detection
    code). ``leaves``: fnmatch patterns on a parameter's leaf name that get no weight decay at all
    (default :data:`DEFAULT_NO_DECAY_LEAVES`; ``()`` for the official segmentation code, which
    decays ``pos_embed`` and ``A_log``). ``names``: substrings of full names with no weight decay.
    """

    flat_decay_mult: float = 0.0
    leaves: Sequence[str] = DEFAULT_NO_DECAY_LEAVES
    names: Sequence[str] = ()

    def multiplier(self, name: str, param: nn.Parameter) -> float:
        """The factor of the base weight decay for ``param`` (called ``name``)."""
        leaf = name.rsplit('.', 1)[-1]
        if any(fnmatchcase(leaf, p) for p in self.leaves) or any(n in name for n in self.names):
            return 0.0
        return self.flat_decay_mult if param.ndim <= 1 else 1.0


def no_decay(name: str, param: nn.Parameter, extra: Iterable[str] = ()) -> bool:
    """Whether ``param`` (called ``name``) is kept out of weight decay by the default rule."""
    return NoDecayRule(names=tuple(extra)).multiplier(name, param) == 0.0


def checked_rate(owner: str, key: str, value) -> float:
    """A layer-decay rate from a config: a finite number in (0, 1], else a one-line error."""
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f'{owner}: {key} must be a number in (0, 1], got {value!r}') from None
    if not (math.isfinite(rate) and 0.0 < rate <= 1.0):
        raise ConfigError(f'{owner}: {key} must be in (0, 1] (1: no decay), got {value!r}')
    return rate


def unwrap_backbone(module: nn.Module):
    """(model, backbone, prefix) of a model (or a model wrapper, or a bare backbone)."""
    model = module.module if is_model_wrapper(module) else module
    backbone = getattr(model, 'backbone', model)
    return model, backbone, 'backbone.' if backbone is not model else ''


def layer_decay_param_groups(module: nn.Module, base_lr: float, base_wd: Optional[float],
                             rate: float, no_decay_names: Iterable[str] = (),
                             scope: str = 'all',
                             rule: Optional[NoDecayRule] = None) -> List[dict]:
    """The parameter groups of layer-wise decay: one per (layer depth, weight decay) pair of
    the backbone, and the rest of the model at the base rate. Each group carries ``lr``,
    ``lr_scale`` and ``weight_decay`` (``base_wd`` times the :class:`NoDecayRule`'s factor,
    default rule plus ``no_decay_names`` unless ``rule`` is given; omitted when ``base_wd`` is
    None: the optimizer's default). ``scope``: :data:`DECAY_SCOPES` (module docstring)."""
    if scope not in DECAY_SCOPES:
        raise ConfigError(f'layer decay scope must be one of {DECAY_SCOPES}, got {scope!r}')
    rule = rule if rule is not None else NoDecayRule(names=tuple(no_decay_names))
    model, backbone, prefix = unwrap_backbone(module)
    groups: Dict[tuple, dict] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        ours = name.startswith(prefix)
        depth, num = backbone.get_layer_depth(name, prefix) if ours else (1, 2)
        if scope == 'embeddings' and depth != 0:
            depth = num - 1
        scale = rate ** (num - 1 - depth)
        mult = rule.multiplier(name, param)
        decay = 0.0 if mult == 0.0 else (None if base_wd is None else base_wd * mult)
        g = groups.setdefault((depth if ours else 'head', decay),
                              dict(params=[], lr=base_lr * scale, lr_scale=scale))
        if decay is not None:      # None: the optimizer's own default
            g['weight_decay'] = decay
        g['params'].append(param)
    return list(groups.values())


def _taught_subclass(upstream: type) -> type:
    """``upstream`` (a library's decay constructor) with ``add_params`` extended to this
    project's backbones."""

    class Taught(upstream):
        __doc__ = (f'{upstream.__module__}.{upstream.__name__}, extended by amvim_mm to its '
                   'backbones (their get_layer_depth); unchanged for every other backbone.')
        taught_by_amvim_mm = True

        def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None):
            # mmseg's LayerDecayOptimizerConstructor pops its required ``layer_decay_rate``
            # with a bare KeyError; the same stop, one line, for every backbone
            keys = sorted(paramwise_cfg or {})
            try:
                super().__init__(optim_wrapper_cfg, paramwise_cfg)
            except KeyError as e:
                raise ConfigError(f'{upstream.__name__}: paramwise_cfg needs {e.args[0]!r}, got '
                                  f'the keys {keys}') from None

        def add_params(self, params: List[dict], module: nn.Module, **kwargs) -> None:
            _, backbone, _ = unwrap_backbone(module)
            if not isinstance(backbone, CheckpointGuard):     # not one of ours
                return super().add_params(params, module, **kwargs)
            params.extend(self._layer_depth_groups(module, backbone))

        def _layer_depth_groups(self, module: nn.Module, backbone) -> List[dict]:
            name, bb = type(self).__name__, type(backbone).__name__
            cfg = self.paramwise_cfg
            decay_type = cfg.get('decay_type', 'layer_wise')
            if decay_type not in LAYER_WISE_TYPES:
                raise ConfigError(f'{name}: decay_type={decay_type!r} is not supported for '
                                  f"{bb}; use decay_type='layer_wise' or amvim_mm's "
                                  "constructor='LayerDecayOptimWrapperConstructor'")
            rate = cfg.get('decay_rate')
            if rate is None:
                raise ConfigError(f'{name}: paramwise_cfg needs decay_rate (e.g. 0.9) for {bb}')
            rate = checked_rate(name, 'decay_rate', rate)
            num_layers = cfg.get('num_layers')
            if num_layers is not None and num_layers != backbone.num_layers:
                raise ConfigError(f'{name}: paramwise_cfg num_layers={num_layers} but the {bb} '
                                  f'backbone has {backbone.num_layers} layers')
            groups = layer_decay_param_groups(module, self.base_lr, self.base_wd,
                                              float(rate))
            MMLogger.get_current_instance().info(
                f'{name} (amvim_mm, {bb}.get_layer_depth): {len(groups)} groups, decay rate '
                f'{rate}')
            return groups

    Taught.__name__ = Taught.__qualname__ = upstream.__name__
    Taught.__module__ = __name__
    return Taught


def teach_upstream_layer_decay() -> None:
    """Register the subclasses described in the module docstring in the optimizer-constructor
    registry of each library of :data:`UPSTREAM_SCOPES` whose registry exists (its
    ``registry`` module is imported); once per registry."""
    for scope, registry in list(OPTIM_WRAPPER_CONSTRUCTORS.children.items()):
        if scope not in UPSTREAM_SCOPES or scope in _taught:
            continue
        registry.import_from_location()   # the library's own constructors, registered first
        for key in UPSTREAM_NAMES:
            upstream = registry.module_dict.get(key)
            if upstream is not None and not getattr(upstream, 'taught_by_amvim_mm', False):
                registry.register_module(name=key, module=_taught_subclass(upstream),
                                         force=True)
        _taught.add(scope)
