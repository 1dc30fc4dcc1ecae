"""The official VMamba model (MzeroMiko/VMamba), loaded from a local checkout to be timed
beside ours.

The official code is not part of this project. A user who wants the speed ratio against it
measured in one process passes the path of a checkout of https://github.com/MzeroMiko/VMamba
(``tools/benchmark.py --official-vmamba PATH``); its single-file model ``vmamba.py`` (the
repository root's copy of ``classification/models/vmamba.py`` and its kernels' Python
wrappers, which also runs on a CPU) is imported from there, unchanged. Its selective scan is
the official automatic backend: ``selective_scan_cuda_oflex`` when built, else mamba-ssm's
``selective_scan_cuda`` (installed here), else its PyTorch loop; its cross-scan/merge are its
Triton kernels on CUDA.

One adapter, applied only while the file is imported: ``fvcore`` (used by the official
``flops()`` only) is replaced by a stand-in module when it is not installed.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os.path as osp
import sys
import types
from typing import Dict, Iterator

import torch
from torch import nn

from amvim_mm.errors import ConfigError, LookupConfigError

#: our arch name -> the official model function of ``vmamba.py``
OFFICIAL_MODELS: Dict[str, str] = {
    'tiny': 'vmamba_tiny_s1l8', 'small': 'vmamba_small_s2l15', 'base': 'vmamba_base_s2l15',
    'tiny-s2l5': 'vmamba_tiny_s2l5', 'small-s1l20': 'vmamba_small_s1l20',
    'base-s1l20': 'vmamba_base_s1l20', 'vanilla-tiny': 'vanilla_vmamba_tiny',
}


def _no_fvcore(*args, **kwargs):
    raise RuntimeError('fvcore is not installed: the official flops() is not available here '
                       '(amvim_mm.analysis.vmamba_flops reproduces its count)')


@contextlib.contextmanager
def _fvcore_stand_in() -> Iterator[None]:
    if importlib.util.find_spec('fvcore') is not None:
        yield
        return
    pkg = types.ModuleType('fvcore')
    pkg.__path__ = []
    nn_mod = types.ModuleType('fvcore.nn')
    for name in ('FlopCountAnalysis', 'flop_count_str', 'flop_count', 'parameter_count'):
        setattr(nn_mod, name, _no_fvcore)
    pkg.nn = nn_mod
    sys.modules['fvcore'], sys.modules['fvcore.nn'] = pkg, nn_mod
    try:
        yield
    finally:
        del sys.modules['fvcore'], sys.modules['fvcore.nn']


@functools.lru_cache(maxsize=None)
def official_module(root: str) -> types.ModuleType:
    """The official single-file ``vmamba.py`` of the checkout at ``root`` (imported once)."""
    path = osp.join(osp.realpath(root), 'vmamba.py')
    if not osp.isfile(path):
        raise ConfigError(f'{root} is not a checkout of MzeroMiko/VMamba (missing {path})')
    spec = importlib.util.spec_from_file_location('amvim_official_vmamba', path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod     # timm's register_model looks the module up there
    try:
        with _fvcore_stand_in():
            spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[spec.name]
        raise
    for attr in OFFICIAL_MODELS.values():
        if not hasattr(mod, attr):
            raise ConfigError(f'{path} has no {attr}(): not the expected official vmamba.py')
    return mod


def scan_backend(root: str) -> str:
    """Which selective scan the official code will use on CUDA (its automatic order)."""
    mod = official_module(root)
    if getattr(mod, 'WITH_SELECTIVESCAN_OFLEX', False):
        return 'oflex'
    if getattr(mod, 'WITH_SELECTIVESCAN_CORE', False):
        return 'core'
    if getattr(mod, 'WITH_SELECTIVESCAN_MAMBA', False):
        return 'mamba'
    return 'torch'


def build_official(arch: str, root: str, weights_from: nn.Module = None,
                   device: str = 'cuda') -> nn.Module:
    """The official whole classifier of ``arch`` (channel-first, as released) in eval mode.

    ``weights_from``: a :class:`~amvim_mm.bench.measure.Classifier` of ours around a
    ``VMamba`` with ``out_type='avg_featmap'``; its weights are loaded strictly (the official
    loader maps the classification key layout), so both compute the same function.
    """
    if arch not in OFFICIAL_MODELS:
        raise LookupConfigError(f'no official VMamba model for {arch!r}; choose from '
                                f'{", ".join(OFFICIAL_MODELS)}')
    model = getattr(official_module(root), OFFICIAL_MODELS[arch])(pretrained=False)
    if weights_from is not None:
        state = {}
        for k, v in weights_from.state_dict().items():
            if k.startswith('backbone.'):
                state[k[len('backbone.'):]] = v
            elif k.startswith('head.'):
                state['classifier.' + k] = v
        model.load_state_dict(state, strict=True)
    return model.to(device).eval()


@torch.no_grad()
def max_abs_diff(official: nn.Module, ours: nn.Module, x: torch.Tensor) -> float:
    """Largest absolute difference of the two models' logits on ``x``."""
    return float((official(x) - ours(x)).abs().max())
