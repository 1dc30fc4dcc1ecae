"""The official Vim model (hustvl/Vim), loaded from a local checkout to be timed beside ours.

The official code is not part of this project. A user who wants the speed ratio against it
measured in one process passes the path of a checkout of https://github.com/hustvl/Vim
(``tools/benchmark.py --official-vim PATH``); its Python model (``vim/models_mamba.py``, with
``vim/rope.py``) and the Python files of its vendored ``mamba-1p1p1/mamba_ssm`` are imported
from there, unchanged, and nothing is built from them. Their compiled kernels come from the
stock packages installed here: ``selective_scan_cuda`` (mamba-ssm, the same ``fwd`` signature)
and ``causal_conv1d_cuda`` (causal-conv1d). The vendored CUDA sources no longer compile with
CUDA 13, which is why the stock kernels stand in.

Three adapters, applied only while the official modules are imported:

* the vendored ``mamba_ssm/__init__.py`` and ``mamba_ssm.utils.generation``/``.hf`` import
  text-generation classes of ``transformers`` that current releases no longer have; the vision
  model only subclasses ``GenerationMixin``. The package is entered without running its
  ``__init__`` and those two modules are empty stand-ins;
* causal-conv1d >= 1.5 writes its output into an ``out`` argument; the vendored code calls the
  1.4 signature that returns it: a wrapper accepts both;
* the vendored package is imported under the name ``mamba_ssm``, which the stock package (our
  unfused path) also uses: the stock modules are set aside during the import and restored
  after it, so both live in one process (the official modules keep their own references).
"""
import contextlib
import functools
import importlib
import os.path as osp
import sys
import types
from typing import Dict, Iterator

import torch
from torch import nn

from amvim_mm.errors import ConfigError, LookupConfigError

#: our benchmark model name -> the official model function (``vim/models_mamba.py``)
OFFICIAL_MODELS: Dict[str, str] = {
    'vim-t': 'vim_tiny_patch16_224_bimambav2_final_pool_mean_abs_pos_embed_with_midclstok_div2',
    'vim-s': 'vim_small_patch16_224_bimambav2_final_pool_mean_abs_pos_embed_with_midclstok_div2',
}
_ISOLATED = ('mamba_ssm', 'models_mamba', 'rope', 'causal_conv1d_cuda')


class _CausalConv1dAdapter(types.ModuleType):
    """``causal_conv1d_cuda`` as the vendored code calls it (the 1.4 signature, returning the
    output), on top of the installed module (1.4: the same; >= 1.5: an ``out`` argument)."""

    def __init__(self, real: types.ModuleType) -> None:
        super().__init__('causal_conv1d_cuda')
        self._real = real
        self._out_arg = None           # decided at the first call

    def causal_conv1d_fwd(self, x, weight, bias, seq_idx, initial_states, final_states_out,
                          silu_activation):
        if self._out_arg is not False:
            out = torch.empty_like(x)
            try:
                self._real.causal_conv1d_fwd(x, weight, bias, seq_idx, initial_states, out,
                                             final_states_out, silu_activation)
                self._out_arg = True
                return out
            except TypeError:
                if self._out_arg:
                    raise
                self._out_arg = False
        return self._real.causal_conv1d_fwd(x, weight, bias, seq_idx, initial_states,
                                            final_states_out, silu_activation)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _empty_module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


@contextlib.contextmanager
def _official_import_scope(root: str) -> Iterator[None]:
    """sys.modules/sys.path as the official files expect them, restored on exit."""
    try:
        import causal_conv1d  # noqa: F401  (the stock package keeps the real kernel module)
        real_conv = importlib.import_module('causal_conv1d_cuda')
    except ImportError:
        real_conv = None
    saved = {k: sys.modules.pop(k) for k in list(sys.modules)
             if k.split('.')[0] in _ISOLATED}
    paths = [osp.join(root, 'vim'), osp.join(root, 'mamba-1p1p1')]
    sys.path[:0] = paths
    pkg = _empty_module('mamba_ssm', __path__=[osp.join(root, 'mamba-1p1p1', 'mamba_ssm')])
    sys.modules['mamba_ssm'] = pkg

    class GenerationMixin:
        """Stand-in: text generation only."""

    def _no_hub(*args, **kwargs):
        raise RuntimeError('the official mamba_ssm.utils.hf is not available here')

    sys.modules['mamba_ssm.utils.generation'] = _empty_module(
        'mamba_ssm.utils.generation', GenerationMixin=GenerationMixin)
    sys.modules['mamba_ssm.utils.hf'] = _empty_module(
        'mamba_ssm.utils.hf', load_config_hf=_no_hub, load_state_dict_hf=_no_hub)
    if real_conv is not None:
        sys.modules['causal_conv1d_cuda'] = _CausalConv1dAdapter(real_conv)
    try:
        yield
    finally:
        for p in paths:
            sys.path.remove(p)
        for k in [k for k in sys.modules if k.split('.')[0] in _ISOLATED]:
            del sys.modules[k]
        sys.modules.update(saved)


@functools.lru_cache(maxsize=None)
def official_module(root: str) -> types.ModuleType:
    """The official ``models_mamba`` module of the checkout at ``root`` (imported once)."""
    root = osp.realpath(root)
    needed = [osp.join(root, 'vim', 'models_mamba.py'),
              osp.join(root, 'mamba-1p1p1', 'mamba_ssm', 'modules', 'mamba_simple.py')]
    missing = [p for p in needed if not osp.isfile(p)]
    if missing:
        raise ConfigError(f'{root} is not a checkout of hustvl/Vim (missing {missing[0]})')
    with _official_import_scope(root):
        mod = importlib.import_module('models_mamba')
        # the vendored files import their dependencies at module level inside try/except,
        # leaving None on failure: a missing kernel is reported here, not as a slow path
        simple = sys.modules['mamba_ssm.modules.mamba_simple']
        for owner, attr in ((simple, 'mamba_inner_fn_no_out_proj'), (mod, 'rms_norm_fn')):
            if getattr(owner, attr, None) is None:
                raise ImportError(f'the official Vim code at {root} could not import {attr} '
                                  '(selective_scan_cuda or triton missing?)')
    return mod


def build_official(name: str, root: str, weights_from: nn.Module = None,
                   device: str = 'cuda') -> nn.Module:
    """The official whole classifier ``name`` (``vim-t``/``vim-s``) in eval mode.

    ``weights_from``: a :class:`~amvim_mm.bench.measure.Classifier` of ours whose weights
    are loaded strictly (the parameter names are the official ones), so both compute the same
    function and their outputs can be compared.
    """
    if name not in OFFICIAL_MODELS:
        raise LookupConfigError(f'no official model for {name!r}; choose from '
                                f'{", ".join(OFFICIAL_MODELS)}')
    mod = official_module(root)
    model = getattr(mod, OFFICIAL_MODELS[name])(pretrained=False)
    if weights_from is not None:
        state = {k[len('backbone.'):] if k.startswith('backbone.') else k: v
                 for k, v in weights_from.state_dict().items()}
        model.load_state_dict(state, strict=True)
    return model.to(device).eval()
