"""The input check every backbone runs on its images: shape, dtype and finite values.

One bad batch must stop with a one-line :class:`~amvim_mm.errors.ConfigError` naming the
backbone and the problem, not run on: a NaN or inf pixel turns every output into NaN (a test
run would still print a metric), and an image of the wrong dtype fails deep inside the first
convolution with a traceback that names neither the model nor the fix.
"""
from __future__ import annotations

import math

import torch

from amvim_mm.errors import ConfigError

#: input dtypes that autocast casts for the stem's convolution / GEMM (float64 it leaves alone)
AUTOCAST_INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HALF_DTYPES = (torch.float16, torch.bfloat16)


#: the largest input magnitude the backbones take: normalised images are within a few units
#: (raw 0-255 pixels too); much larger finite values overflow in the norms' squares
MAX_INPUT = 1e6


def check_image_shape(name: str, x, in_channels: int, min_size: int) -> None:
    """A (B, C, H, W) tensor with B >= 1, ``in_channels`` channels and H, W of at least
    ``min_size`` (one patch of the stem); else a ConfigError that starts with ``name``."""
    C = in_channels
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f'{name}: expected images as a tensor of shape (B, {C}, H, W), got '
                          f'{type(x).__name__}')
    if x.dim() != 4:
        raise ConfigError(f'{name}: expected images of shape (B, C, H, W) = (B, {C}, H, W), '
                          f'got {tuple(x.shape)}')
    if x.shape[1] != C:
        raise ConfigError(f'{name}: expected {C} input channels, got {x.shape[1]} (input shape '
                          f'{tuple(x.shape)}, expected (B, {C}, H, W))')
    if x.shape[0] == 0:
        raise ConfigError(f'{name}: empty batch: got input of shape {tuple(x.shape)}; expected '
                          f'(B, {C}, H, W) with B >= 1 images')
    H, W = x.shape[-2:]
    if H < min_size or W < min_size:
        raise ConfigError(f'{name}: input image {H}x{W} is smaller than one patch '
                          f'({min_size}x{min_size})')


def check_image_dtype(name: str, x: torch.Tensor, model_dtype: torch.dtype) -> None:
    """Images of the model's floating-point dtype, or - under autocast on the images' device,
    for a float32 model or one of the autocast dtype - of a dtype autocast casts (float32,
    float16, bfloat16); else a ConfigError.

    What each backbone does otherwise (CPU, torch 2.x): a float32 model given float16,
    bfloat16 or float64 images without autocast, or integer images, stops in the stem with
    "Input type ... and bias type ... should be the same" or "expected scalar type ...", and a
    16-bit model under autocast to the other 16-bit type stops deeper ("mixed dtype",
    "Unexpected floating ScalarType"). Refused here by name, with the fix. Integer images
    (uint8 straight from a decoder) are refused whatever the model: they are not normalised.
    A half model with half images (``model.half()``), a float32 model under autocast and a
    16-bit model under autocast to its own dtype run.
    """
    if not x.is_floating_point():
        raise ConfigError(f'{name}: the input images are {x.dtype}, not floating point; '
                          'normalise them to float first (a data_preprocessor with mean/std '
                          'does this)')
    device = x.device.type
    cast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    if cast is not None and model_dtype in HALF_DTYPES and model_dtype != cast:
        raise ConfigError(f'{name}: the model is {model_dtype} but autocast casts to {cast}; '
                          f'autocast a float32 model, or run the {model_dtype} model without '
                          'autocast')
    if x.dtype == model_dtype:
        return
    if cast is not None and model_dtype in (torch.float32, cast) and \
            x.dtype in AUTOCAST_INPUT_DTYPES:
        return
    raise ConfigError(f'{name}: the input images are {x.dtype} but the model is '
                      f'{model_dtype}; cast the images to {model_dtype}, convert the model, '
                      'or run a float32 model under torch.autocast')


class ImageInputCheck:
    """Mixin of a backbone (an ``nn.Module`` with ``in_channels``, ``min_input_size`` (the
    smallest H and W its stem takes) and a ``patch_embed`` that meets the images first):
    :meth:`check_images` validates every forward's images."""

    #: check every forward's images for NaN/inf (see :meth:`check_images`); a subclass or an
    #: instance may set it to False to save the reduction and its host sync
    check_finite_input = True

    def input_dtype(self) -> torch.dtype:
        """The dtype the images must have outside autocast: the stem's parameters' (a
        backbone may name its first weight directly: the generic lookup is slower)."""
        return next(self.patch_embed.parameters()).dtype

    def check_images(self, x: torch.Tensor) -> None:
        """Validate a batch of images.

        Raises :class:`~amvim_mm.errors.ConfigError` naming the backbone for anything but a
        (B, C, H, W) tensor with B >= 1, the model's C, H and W of at least one patch
        (:func:`check_image_shape`), a dtype the model takes (:func:`check_image_dtype`) and -
        when ``check_finite_input`` is True (default) - finite values of at most
        :data:`MAX_INPUT` in magnitude: one bad pixel would otherwise turn every output into
        NaN without a word, and huge finite ones overflow inside. The test is a single
        ``aminmax`` reduction per forward (the values are counted only when it fails). It
        is skipped while a CUDA graph is being captured (no sync is allowed there), while
        ``torch.jit`` traces or scripts the model (a traced graph could not keep a
        data-dependent check anyway) and while ``torch.compile`` traces it (a data-dependent
        branch would break the graph).
        """
        name = type(self).__name__
        check_image_shape(name, x, self.in_channels, self.min_input_size)
        check_image_dtype(name, x, self.input_dtype())
        if self.check_finite_input and not self._skip_finite_check(x):
            largest = self._largest(x)
            if not math.isfinite(largest):
                bad = int((~torch.isfinite(x)).sum())
                raise ConfigError(f'{name}: the input images hold {bad} non-finite (NaN or '
                                  f'inf) values of {x.numel()} (input shape '
                                  f'{tuple(x.shape)}); every output would be NaN')
            if largest > MAX_INPUT:
                raise ConfigError(f'{name}: the input images hold values up to {largest:.3g}; '
                                  f'the backbone takes normalised images (|x| <= {MAX_INPUT:g}): '
                                  'larger finite values overflow inside (non-finite outputs)')

    @staticmethod
    def _largest(x: torch.Tensor) -> float:
        """The largest magnitude in ``x`` (NaN or inf when a value is not finite), from one
        ``aminmax`` pass over the images (NaN propagates through it)."""
        lo, hi = (float(v) for v in torch.aminmax(x))
        return float('nan') if math.isnan(lo) or math.isnan(hi) else max(abs(lo), abs(hi))

    @staticmethod
    def _skip_finite_check(x: torch.Tensor) -> bool:
        if torch.jit.is_tracing() or torch.jit.is_scripting():
            return True
        compiler = getattr(torch, 'compiler', None)
        if compiler is not None and hasattr(compiler, 'is_compiling') and \
                compiler.is_compiling():
            return True
        return x.is_cuda and torch.cuda.is_current_stream_capturing()
