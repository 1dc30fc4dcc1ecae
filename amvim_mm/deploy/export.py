"""ONNX export of the backbones (and whole models): :func:`export_mode` and :func:`export_onnx`.

A backbone takes its export route by itself while it is exported (``torch.onnx.export`` with
either exporter, ``torch.export``; :func:`amvim_mm.runtime.exporting`), so a plain
``torch.onnx.export(model.eval(), x, opset_version=17)`` works: the runtime switches are frozen
(:data:`amvim_mm.runtime.EXPORT`: the PyTorch selective scan and causal conv, no fused Triton
or compiled CPU kernels, no CUDA graphs, no environment read inside the traced forward), the
index tensors of the scan orders are constants (:mod:`amvim_mm.models.layout.constants`) and
the selective scan is the chunked PyTorch scan with its chunk plan unrolled
(:func:`amvim_mm.ops.selective_scan.selective_scan_torch`: about ``2 * sqrt(L)`` steps of
element-wise ops, not one node group per token).

What an export fixes: the **image size** (the patch grid, hence the sequence length, the chunk
loop, the scan orders' permutations and a reducer's token counts per block are constants of
the graph); the **batch** stays dynamic (``dynamic_batch=True``) wherever the model allows.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from typing import Iterator, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from amvim_mm import runtime
from amvim_mm.errors import ConfigError, first_line

__all__ = ['export_mode', 'export_onnx', 'MIN_OPSET']

#: the oldest ONNX opset the export route targets (LayerNorm, the ops of the chunked scan)
MIN_OPSET = 17


@contextlib.contextmanager
def export_mode() -> Iterator[runtime.Settings]:
    """The runtime switches frozen for an export (:func:`amvim_mm.runtime.frozen_for_export`)
    and :func:`amvim_mm.runtime.exporting` true in the block, whatever traces the model (also a
    plain ``torch.jit.trace``); yields the settings in force."""
    with runtime.frozen_for_export() as s:
        yield s


def _as_inputs(inputs) -> Tuple[torch.Tensor, ...]:
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs, )
    if not isinstance(inputs, (tuple, list)) or not inputs or not all(
            isinstance(t, torch.Tensor) for t in inputs):
        raise ConfigError('export_onnx: inputs must be a tensor or a tuple of tensors, got '
                          f'{type(inputs).__name__}')
    return tuple(inputs)


def _check_model_input(model: nn.Module, x: torch.Tensor) -> None:
    """An image batch the model takes (its own input check, when it has one)."""
    check = getattr(model, 'check_images', None)
    if check is None:
        backbone = getattr(model, 'backbone', None)
        check = getattr(backbone, 'check_images', None)
    if check is not None:
        check(x)


def _require_onnx():
    try:
        import onnx
    except ImportError:
        raise ConfigError('export_onnx needs the onnx package: pip install -r '
                          'requirements/deploy.txt') from None
    return onnx


def export_onnx(model: nn.Module,
                path: Union[str, os.PathLike],
                inputs,
                *,
                opset: int = MIN_OPSET,
                dynamo: bool = False,
                dynamic_batch: bool = True,
                input_names: Sequence[str] = ('input', ),
                output_names: Optional[Sequence[str]] = None) -> str:
    """Export ``model`` (put in eval mode) to an ONNX file at ``path`` and return the path.

    The export runs under :func:`export_mode`; the file is checked by ``onnx.checker`` and
    written atomically (a temporary file in the same folder, then ``os.replace``). The image
    size of ``inputs`` is fixed in the graph (see the module docstring); ``dynamic_batch``
    makes the first dimension of every input and output symbolic (``'batch'``).

    Args:
        model: a backbone or a whole model whose ``forward(*inputs)`` returns tensors.
        path: the ``.onnx`` file to write.
        inputs: one tensor (images, (B, C, H, W)) or a tuple of tensors.
        opset: ONNX opset, at least :data:`MIN_OPSET` (the ``dynamo`` exporter may raise it to
            its own minimum, 18).
        dynamo: ``torch.onnx.export``'s ``torch.export``-based exporter instead of the
            TorchScript one.
        dynamic_batch: a symbolic batch dimension.
        input_names, output_names: graph names (default outputs ``output_0``, ...).

    Raises:
        ConfigError: onnx missing, inputs that are not tensors or that the model refuses
            (its input check), an opset below :data:`MIN_OPSET` (one line each).
    """
    onnx = _require_onnx()
    if not isinstance(opset, int) or opset < MIN_OPSET:
        raise ConfigError(f'export_onnx: opset must be an int >= {MIN_OPSET}, got {opset!r}')
    xs = _as_inputs(inputs)
    if len(input_names) != len(xs):
        raise ConfigError(f'export_onnx: {len(xs)} inputs but {len(input_names)} input names')
    model.eval()
    _check_model_input(model, xs[0])
    with torch.no_grad():
        shapes = [tuple(t.shape) for t in _flat(model(*xs))]
    n_out = len(shapes)
    names = list(output_names) if output_names is not None else \
        [f'output_{i}' for i in range(n_out)]
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix='.onnx', dir=folder)
    os.close(fd)
    try:
        with export_mode(), torch.no_grad(), warnings.catch_warnings():
            # the tracer's notes that shapes become constants: expected, the image size is
            # fixed at export (the docstring); the batch stays symbolic where asked
            warnings.simplefilter('ignore', torch.jit.TracerWarning)
            warnings.filterwarnings('ignore', message='Constant folding - Only steps=1')
            try:
                with _quiet_stdout():
                    torch.onnx.export(model, xs, tmp, opset_version=opset, dynamo=dynamo,
                                      input_names=list(input_names), output_names=names,
                                      **_dynamic(xs, input_names, names, dynamic_batch,
                                                 dynamo))
            except ConfigError:
                raise
            except Exception as err:     # the exporters' errors: thousands of lines of trace
                raise ConfigError(f'export_onnx: the {_how(dynamo)} exporter cannot export '
                                  f'this model: {_first_line(err)}') from None
        _name_output_sizes(onnx, tmp, shapes, dynamic_batch)
        onnx.checker.check_model(tmp)
        if dynamic_batch:
            _check_dynamic_batch(onnx.load(tmp, load_external_data=False).graph, dynamo)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


@contextlib.contextmanager
def _quiet_stdout():
    """The exporter's own prints (on a failure the TorchScript exporter writes the whole
    graph, thousands of lines, to standard output) go to a discarded file; our error says
    what failed."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


def _how(dynamo: bool) -> str:
    return 'torch.export-based' if dynamo else 'TorchScript'


def _first_line(err: BaseException) -> str:
    """The exporter's message without its trace: the first line, and for the TorchScript
    exporter's symbolic errors the part before the offending graph value."""
    text = first_line(err, limit=10_000)
    return text.split('  [Caused by')[0].split(' Please feel free to request support')[0][:300]


def _check_dynamic_batch(graph, dynamo: bool) -> None:
    """A dynamic batch was asked for: every graph input must have a symbolic first dimension
    (``torch.export`` fixes a dimension of size 1 of its example; an exporter that fixed it
    would otherwise write a file that fails at any other batch without a word)."""
    for v in graph.input:
        dims = v.type.tensor_type.shape.dim
        if dims and not dims[0].dim_param:
            raise ConfigError(f'export_onnx: the {_how(dynamo)} exporter fixed the batch of input '
                              f'{v.name!r} at {dims[0].dim_value}, though a dynamic batch was '
                              'asked for (export with an example batch of 2 or more, or a '
                              'static deploy config)')


def _name_output_sizes(onnx, path: str, shapes, dynamic_batch: bool) -> None:
    """Write the outputs' sizes that the exporter's shape inference lost (after a reduced
    backbone it names them after the last op, e.g. ``Resizeseg_logits_dim_2``): the image size
    is fixed at export, so every dimension but a dynamic batch is the traced output's."""
    model = onnx.load(path, load_external_data=False)
    changed = False
    for v, shape in zip(model.graph.output, shapes, strict=True):
        dims = v.type.tensor_type.shape.dim
        if len(dims) != len(shape):          # no rank known: leave it to the runtime
            continue
        for i, (d, size) in enumerate(zip(dims, shape, strict=True)):
            if d.dim_param and not (i == 0 and dynamic_batch):
                d.dim_value = size
                changed = True
    if changed:
        onnx.save(model, path)


def _flat(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flat(o)]
    raise ConfigError(f'export_onnx: the model returns {type(out).__name__}; export a '
                      'module whose forward returns tensors')


def _dynamic(xs, input_names, output_names, dynamic_batch: bool, dynamo: bool) -> dict:
    """The exporter's arguments for a symbolic batch dimension (none without it)."""
    if not dynamic_batch:
        return {}
    if dynamo:
        batch = torch.export.Dim('batch', min=1, max=4096)
        return dict(dynamic_shapes=tuple({0: batch} for _ in xs))
    axes = {n: {0: 'batch'} for n in list(input_names) + list(output_names)}
    return dict(dynamic_axes=axes)
