"""Compatibility shims for upstream breakage, all in one place.

Each shim names the upstream problem and the version that fixes it. Nothing here edits installed
packages or monkeypatches other libraries' classes; the hooks into another library are
registering our own checkpoint loaders through mmengine's public ``CheckpointLoader`` API,
(3) two lookup functions of mmengine's config parser swapped for cached ones while our
``load_config`` parses a file, and (4) subclasses of mmseg's / mmdet's layer-decay constructors
registered under their names in those libraries' registries.

1. **torch >= 2.6 ``torch.load(weights_only=True)`` default vs mmengine 0.10.7.**
   mmengine 0.10.7 calls ``torch.load`` without an allow-list; under torch >= 2.6 its own
   training checkpoints (``HistoryBuffer``, numpy scalars, ``builtins.getattr``) then fail to load
   in ``load_from``, ``resume`` and ``load_checkpoint``. Fixed on mmengine's main branch after
   0.10.7 (unreleased as of 2026-11). Our fix: mmengine's loader for local paths is replaced by
   :func:`amvim_mm.utils.safe_load.load_checkpoint_file` (weights-only with an allow-list of the
   types those files hold; see that module), registered through mmengine's public
   ``CheckpointLoader.register_scheme``. So is every other prefix mmengine registers: its
   ``load_from_http`` and the ``torchvision://``/``open-mmlab://``/``mmcls://``/``pavi://``/
   ``s3://`` loaders unpickle fully (``torch.hub.load_state_dict_from_url`` defaults to
   ``weights_only`` off); ours (:mod:`amvim_mm.utils.remote_checkpoint`) read the same cached
   file through the allow-list. Not fixed upstream as of mmengine 0.10.7.
2. **Official Vim files through the libraries' own tools.** ``tools/test.py`` of mmpretrain
   (``load_from``) hands an official file (weights under ``"model"``, keys without
   ``backbone.``) to the whole classifier, where no key matches: mmengine only warns and the
   model runs on random weights. The same loader returns such a file in the layout of an
   mmpretrain ``ImageClassifier`` (``backbone.*``, ``head.fc.*``), so it loads right; a
   segmentor or detector refuses it (see ``VimFamilyBackbone._check_loaded``).
3. **mmengine 0.10.7 parses every metafile of mmseg / mmdet / mmpretrain for each
   ``package::`` base of a config** (and reloads ``pkg_resources`` each time): most of a config
   load's time. :func:`amvim_mm.utils.config_lookup.cached_package_lookups`, used by
   ``load_config``, swaps those two lookups for cached ones for the duration of one parse (the
   one place in the package where another library's functions are replaced, and only inside
   that block; the tests' Triton-interpreter shortcut in ``amvim_mm.testing`` is the other).
   Not fixed as of mmengine 0.10.7, the pinned version.
4. **mmseg 1.2.2's ``LayerDecayOptimizerConstructor`` / ``LearningRateDecayOptimizerConstructor``
   and mmdet 3.3.0's ``LearningRateDecayOptimizerConstructor``** pick layers by the backbone's
   class name (ConvNeXt, BEiT, MAE) and raise a bare ``NotImplementedError`` for any other
   backbone. :func:`amvim_mm.models.skeleton.layer_decay.teach_upstream_layer_decay`, called
   when one of our backbones is built, registers under the same names in those libraries' own
   registries (public ``Registry.register_module(force=True)``) a subclass that uses our
   backbones' ``get_layer_depth`` and is the library's code, unchanged, for every other
   backbone; it also turns mmseg's bare ``KeyError('layer_decay_rate')`` into a one-line
   error. Only registries that already exist are touched; ``import amvim_mm`` imports neither
   library. Not fixed as of mmseg 1.2.2 / mmdet 3.3.0.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, Dict

from .checkpoint import as_model_checkpoint
from .remote_checkpoint import SCHEMES
from .safe_load import load_checkpoint_file


def _mmengine_local_loader(filename: str, map_location: Any = None) -> Any:
    filename = os.path.expanduser(filename)
    if not os.path.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return as_model_checkpoint(load_checkpoint_file(filename, map_location=map_location))


def _for_mmengine(loader: Callable[..., Any]) -> Callable[..., Any]:
    """A remote loader that returns official files in the layout mmengine loads (as the local
    one does), under the loader's name (mmengine logs ``Loads checkpoint by <name> backend``)."""
    @functools.wraps(loader)
    def load(filename: str, map_location: Any = None) -> Any:
        return as_model_checkpoint(loader(filename, map_location))
    return load


#: what mmengine's ``CheckpointLoader`` gets for each prefix
MMENGINE_LOADERS: Dict[str, Callable[..., Any]] = {
    '': _mmengine_local_loader, **{p: _for_mmengine(f) for p, f in SCHEMES.items()}}


def register_checkpoint_loader() -> None:
    """Register our safe loaders as mmengine's loaders for local paths and every prefix.

    Uses mmengine's public ``CheckpointLoader.register_scheme`` (``force=True`` replaces its
    ``load_from_local``, whose bare ``torch.load`` fails on torch >= 2.6, and its remote loaders,
    which unpickle fully).
    """
    from mmengine.runner.checkpoint import CheckpointLoader
    for prefix, loader in MMENGINE_LOADERS.items():
        CheckpointLoader.register_scheme(prefixes=prefix, loader=loader, force=True)
