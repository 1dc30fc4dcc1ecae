"""The official Vision-LSTM (NX-AI/vision-lstm), loaded from a local checkout to be timed beside
our ViL.

The official code is not part of this project. A user who wants the speed ratio against it
measured in one process passes the path of a checkout of https://github.com/NX-AI/vision-lstm
(``tools/benchmark.py --official-vil PATH``); its package ``vision_lstm`` (pure PyTorch; needs
``einops``) is imported from there, unchanged, under a private module name.

Both sides compute the same whole classifier: the official ``VisionLSTM2`` (``mode='classifier'``,
``pooling='bilateral_flatten'``, ``legacy_norm=True``, as the released ViL-T/S/B) and ours, a
:class:`ViLClassifier` (our ``ViL`` with ``out_type='pooled'``, the official classifier input,
and a linear head), with the official weights loaded into ours strictly.
"""
from __future__ import annotations

import functools
import importlib.util
import os.path as osp
import sys
import types
from typing import Dict

import torch
from torch import nn

from amvim_mm.errors import ConfigError, LookupConfigError

#: our arch name -> the official ``VisionLSTM2`` arguments (hubconf ``vil2-*``)
OFFICIAL_ARCHS: Dict[str, dict] = {
    'tiny': dict(dim=192, depth=12), 'small': dict(dim=384, depth=12),
    'base': dict(dim=768, depth=12),
}
_PACKAGE = 'amvim_official_vision_lstm'


@functools.lru_cache(maxsize=None)
def official_package(root: str) -> types.ModuleType:
    """The official ``vision_lstm`` package of the checkout at ``root`` (imported once)."""
    init = osp.join(osp.realpath(root), 'vision_lstm', '__init__.py')
    if not osp.isfile(init):
        raise ConfigError(f'{root} is not a checkout of NX-AI/vision-lstm (missing {init})')
    spec = importlib.util.spec_from_file_location(
        _PACKAGE, init, submodule_search_locations=[osp.dirname(init)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[_PACKAGE] = mod     # its relative imports look the package up there
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        for name in [n for n in sys.modules if n.split('.')[0] == _PACKAGE]:
            del sys.modules[name]
        raise
    if not hasattr(mod, 'VisionLSTM2'):
        raise ConfigError(f'{init} has no VisionLSTM2: not the expected official package')
    return mod


class ViLClassifier(nn.Module):
    """Our ViL (pooled: the official classifier input) and a linear head."""

    def __init__(self, arch: str, img_size: int = 224, num_classes: int = 1000, **kwargs):
        super().__init__()
        from amvim_mm.registry import MODELS
        self.backbone = MODELS.build(dict(type='ViL', arch=arch, img_size=img_size,
                                          out_type='pooled', **kwargs))
        self.head = nn.Linear(2 * self.backbone.embed_dims, num_classes)

    def forward(self, x):
        return self.head(self.backbone(x)[-1])


def _official_config(arch: str, img_size: int) -> dict:
    if arch not in OFFICIAL_ARCHS:
        raise LookupConfigError(f'no official VisionLSTM2 for {arch!r}; choose from '
                                f'{", ".join(OFFICIAL_ARCHS)}')
    return dict(OFFICIAL_ARCHS[arch], input_shape=(3, img_size, img_size), output_shape=(1000, ),
                mode='classifier', pooling='bilateral_flatten', legacy_norm=True,
                conv_kind='2d', conv_kernel_size=3, proj_bias=True, norm_bias=True)


def build_pair(arch: str, root: str, img_size: int = 224, device: str = 'cuda', **ours_kwargs):
    """``(official, ours)``: the official ``VisionLSTM2`` classifier (random initialisation) and
    our :class:`ViLClassifier` with its weights (the backbone loads the official key set
    strictly, the head is copied), both in eval mode on ``device``."""
    official = official_package(root).VisionLSTM2(**_official_config(arch, img_size))
    ours = ViLClassifier(arch, img_size, **ours_kwargs)
    state = official.state_dict()
    ours.backbone.load_state_dict(state, strict=True)     # its pre-hook drops head.*
    ours.head.load_state_dict({'weight': state['head.weight'], 'bias': state['head.bias']})
    return official.to(device).eval(), ours.to(device).eval()


@torch.no_grad()
def max_rel_diff(official: nn.Module, ours: nn.Module, x: torch.Tensor) -> float:
    """max |ours - official| / max |official| of the two classifiers' logits on ``x``."""
    ref = official(x)
    return float((ours(x) - ref).abs().max() / ref.abs().max())
