"""Depthwise causal 1-D convolution (the width-4 conv in front of every Mamba scan).

``y[b, e, t] = bias[e] + sum_k weight[e, k] * x[b, e, t - (K - 1) + k]`` with zeros before the
start, then an optional SiLU. Backends:

* ``cuda``: the ``causal-conv1d`` package's ``causal_conv1d_fn`` (CUDA tensors, K in 2..4);
* ``torch``: ``F.conv1d`` depthwise with left padding K - 1 (any device, autograd).

The choice: the ``backend`` argument, else the environment variable ``AMVIM_CONV_BACKEND``
(``auto``/``cuda``/``torch``, default ``auto``: ``cuda`` when usable for the tensors at hand,
else ``torch``); logged once per backend on the ``amvim_mm`` logger.
"""
from __future__ import annotations

from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from amvim_mm import runtime
from amvim_mm.errors import BackendUnavailableError, ConfigError
from . import backends

__all__ = ['causal_conv1d_fn', 'causal_conv1d_torch', 'resolve_conv_backend', 'CONV_BACKENDS']

CONV_BACKENDS = runtime.CONV_BACKENDS
CONV_ENV_VAR = runtime.variable_of('conv_backend')
_ACTIVATIONS = (None, 'silu', 'swish')
_CUDA_WIDTHS = (2, 3, 4)  # widths the causal-conv1d kernel supports


def resolve_conv_backend(is_cuda: bool, width: int, backend: Optional[str] = None) -> str:
    """Pick ``cuda`` or ``torch`` for tensors on CUDA (``is_cuda``) and a kernel ``width``."""
    name = (runtime.parse_value('conv_backend', backend) if backend is not None
            else runtime.settings().conv_backend)
    if name == 'auto':
        if is_cuda and width in _CUDA_WIDTHS and backends.causal_conv1d_kernel()[0] is not None:
            return 'cuda'
        return 'torch'
    if name == 'cuda':
        fn, reason = backends.causal_conv1d_kernel()
        if fn is None:
            raise BackendUnavailableError('causal conv backend "cuda" was requested but '
                                          f'causal-conv1d is not usable ({reason}); install it '
                                          'or use "torch"')
        if not is_cuda:
            raise BackendUnavailableError('causal conv backend "cuda" needs CUDA tensors; got '
                                          'CPU tensors')
        if width not in _CUDA_WIDTHS:
            raise BackendUnavailableError(f'causal conv backend "cuda" supports kernel '
                                          f'widths {_CUDA_WIDTHS}; got {width}')
    return name


def _check(x: Tensor, weight: Tensor, bias: Optional[Tensor], activation: Optional[str]) -> Tensor:
    """Validate the inputs; return the weight as (E, K)."""
    if activation not in _ACTIVATIONS:
        raise ConfigError(f'activation must be None, "silu" or "swish"; got {activation!r}')
    if x.dim() != 3:
        raise ConfigError(f'x must have shape (batch, E, L); got {tuple(x.shape)}')
    dim = x.shape[1]
    if weight.dim() == 3 and weight.shape[1] == 1:
        weight = weight.squeeze(1)
    if weight.dim() != 2 or weight.shape[0] != dim or weight.shape[1] < 1:
        raise ConfigError(f'weight must have shape (E={dim}, K) or (E, 1, K); got '
                          f'{tuple(weight.shape)} for x {tuple(x.shape)}')
    if bias is not None and bias.shape != (dim, ):
        raise ConfigError(f'bias must have shape (E={dim},); got {tuple(bias.shape)}')
    return weight


def causal_conv1d_torch(x: Tensor,
                        weight: Tensor,
                        bias: Optional[Tensor] = None,
                        activation: Optional[str] = None) -> Tensor:
    """Depthwise causal conv with ``F.conv1d`` (left padding K - 1, first L outputs kept).

    The weight and bias are cast to ``x.dtype`` (``F.conv1d`` needs one dtype).
    """
    weight = _check(x, weight, bias, activation)
    dim, width = weight.shape
    length = x.shape[-1]
    y = F.conv1d(x, weight.to(x.dtype).unsqueeze(1),
                 None if bias is None else bias.to(x.dtype), padding=width - 1, groups=dim)
    y = y[..., :length]
    return F.silu(y) if activation is not None else y


def causal_conv1d_fn(x: Tensor,
                     weight: Tensor,
                     bias: Optional[Tensor] = None,
                     activation: Optional[str] = None,
                     backend: Optional[str] = None) -> Tensor:
    """Depthwise causal conv on the chosen backend.

    Args:
        x: (batch, E, L).
        weight: (E, K) or (E, 1, K) (the ``nn.Conv1d(groups=E)`` weight).
        bias: optional (E,).
        activation: ``None``, ``'silu'`` or ``'swish'`` (the same).
        backend: ``None`` (env var ``AMVIM_CONV_BACKEND``, default ``auto``), ``'auto'``,
            ``'cuda'`` or ``'torch'``. Unknown names raise ``ValueError``; ``'cuda'`` when the
            kernel is not importable, the tensors are on the CPU or K is not 2..4 raises
            ``RuntimeError``.

    Returns:
        (batch, E, L) of ``x.dtype``.
    """
    weight = _check(x, weight, bias, activation)
    name = resolve_conv_backend(x.is_cuda, weight.shape[1], backend)
    backends.log_choice_once('causal_conv1d', name)
    if name == 'cuda':
        fn = backends.causal_conv1d_kernel()[0]
        if x.stride(-1) != 1 and x.stride(1) != 1:
            x = x.contiguous()
        return fn(x, weight.contiguous(), bias, activation=activation)
    return causal_conv1d_torch(x, weight, bias, activation)
