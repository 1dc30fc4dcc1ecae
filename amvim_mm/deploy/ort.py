"""Running an exported model in ONNX Runtime (CPU) and comparing it with PyTorch.

* :func:`ort_session` opens a ``.onnx`` file in an ONNX Runtime session on the CPU with a fixed
  number of threads (so that timings of ONNX Runtime and PyTorch use the same cores);
* :func:`run_onnx` feeds arrays (or tensors) to the session's inputs in order;
* :func:`compare_onnx` runs the same inputs through the PyTorch model and the ONNX file and
  reports, per output, the **maximum relative error** ``max|onnx - torch| / max|torch|`` (the
  largest absolute difference over the largest magnitude of the PyTorch output, so that one
  number is comparable across outputs of different scale; 0 when both are all zeros).

ONNX Runtime is an optional extra (``requirements/deploy.txt``); without it every function
ends with a one-line :class:`~amvim_mm.errors.ConfigError` naming the install command.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from amvim_mm.errors import ConfigError

INSTALL_HINT = ('pip install -r requirements/deploy.txt (or: AMVIM_EXTRAS=deploy bash '
                'tools/setup_env.sh)')


def require_onnxruntime():
    """The ``onnxruntime`` module, or a one-line error naming the install command."""
    try:
        import onnxruntime
    except ImportError:
        raise ConfigError(f'ONNX Runtime is not installed: {INSTALL_HINT}') from None
    return onnxruntime


def ort_session(path: str, threads: Optional[int] = None, spin: bool = True):
    """An ONNX Runtime CPU session of the model file ``path``.

    ``threads`` sets the intra-op thread count (inter-op: 1, sequential execution); None keeps
    ONNX Runtime's default (one per core). ``spin=False``: its worker threads sleep between
    calls instead of spinning (ONNX Runtime's default spins, which takes the cores from
    PyTorch work that follows: the benchmarks that interleave both runtimes turn it off). A
    missing file raises ``FileNotFoundError``, a file ONNX Runtime refuses a one-line
    :class:`ConfigError` with its reason.
    """
    ort = require_onnxruntime()
    if not os.path.isfile(path):
        raise FileNotFoundError(f'ONNX file not found: {path}')
    if threads is not None and int(threads) < 1:
        raise ConfigError(f'threads must be a positive integer, got {threads}')
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.inter_op_num_threads = 1
    if threads is not None:
        opts.intra_op_num_threads = int(threads)
    if not spin:
        opts.add_session_config_entry('session.intra_op.allow_spinning', '0')
    try:
        return ort.InferenceSession(path, sess_options=opts, providers=['CPUExecutionProvider'])
    except Exception as err:  # onnxruntime raises its own Fail / InvalidGraph / ... types
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f'ONNX Runtime cannot load {path}: {first}') from None


def _as_array(x) -> np.ndarray:
    if hasattr(x, 'detach'):   # a torch tensor
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    return arr.astype(np.float32) if arr.dtype == np.float64 else arr


def run_onnx(session, *arrays) -> List[np.ndarray]:
    """Run ``session`` on ``arrays`` (numpy arrays or torch tensors, one per model input, in the
    session's input order); returns the outputs in the session's output order."""
    names = [i.name for i in session.get_inputs()]
    if len(arrays) != len(names):
        raise ConfigError(f'the ONNX model takes {len(names)} input(s) ({", ".join(names)}), '
                          f'got {len(arrays)}')
    feed = {n: _as_array(a) for n, a in zip(names, arrays)}
    for inp in session.get_inputs():
        want, got = inp.shape, feed[inp.name].shape
        fixed = [d if isinstance(d, int) else None for d in want]
        if len(want) != len(got) or any(w is not None and w != g for w, g in zip(fixed, got)):
            shown = tuple(d if isinstance(d, int) else '?' for d in want)
            raise ConfigError(f'input {inp.name!r} of the ONNX model has shape {shown}, got '
                              f'{tuple(got)} (fixed sizes are set at export)')
    return session.run(None, feed)


def flatten_outputs(out) -> List:
    """The tensors of a model output (a tensor, or nested tuples / lists / dicts of them) in
    order: the order in which the exporters number a model's outputs."""
    if hasattr(out, 'detach'):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flatten_outputs(o)]
    raise ConfigError(f'model output of type {type(out).__name__} is not a tensor or a '
                      f'sequence of tensors')


def max_relative_error(reference: np.ndarray, value: np.ndarray) -> float:
    """``max|value - reference| / max|reference|`` (0 when both are all zeros, inf when only
    ``reference`` is, and inf when either holds a NaN or an infinity: a non-finite output is
    never "close", and NaN would otherwise vanish in a later ``max``)."""
    reference = np.asarray(reference, dtype=np.float64)
    value = np.asarray(value, dtype=np.float64)
    if reference.shape != value.shape:
        raise ConfigError(f'output shapes differ: PyTorch {reference.shape}, ONNX {value.shape}')
    if reference.size == 0:
        return 0.0
    if not (np.all(np.isfinite(reference)) and np.all(np.isfinite(value))):
        return float('inf')
    diff = float(np.max(np.abs(value - reference)))
    scale = float(np.max(np.abs(reference)))
    if scale == 0:
        return 0.0 if diff == 0 else float('inf')
    return diff / scale


def compare_onnx(model, path: str, inputs: Sequence, session=None,
                 threads: Optional[int] = None) -> Dict[str, dict]:
    """Run ``inputs`` (a tensor or a sequence of tensors) through ``model`` (in eval mode, no
    gradients) and through the ONNX file ``path``; per output (the ONNX output names, in order):
    ``max_rel_err`` = max|onnx - torch| / max|torch|, ``max_abs_err`` and ``shape``.

    ``session`` reuses an open :func:`ort_session` (``threads`` applies to a new one).
    """
    import torch
    if hasattr(inputs, 'detach'):
        inputs = (inputs, )
    inputs = tuple(inputs)
    session = session or ort_session(path, threads)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ref = [t.float().cpu().numpy() for t in flatten_outputs(model(*inputs))]
    finally:
        model.train(was_training)
    got = run_onnx(session, *inputs)
    names = [o.name for o in session.get_outputs()]
    if len(ref) != len(got):
        raise ConfigError(f'PyTorch gives {len(ref)} output(s), the ONNX model {len(got)}')
    result = {}
    for name, r, g in zip(names, ref, got):
        result[name] = dict(max_rel_err=max_relative_error(r, g),
                            max_abs_err=float(np.max(np.abs(g - r))) if r.size else 0.0,
                            shape=tuple(r.shape))
    return result


def near_ties(forward, images) -> Optional[np.ndarray]:
    """Which images sit at a near tie of the reducer's token choices: (B,) bool from a PyTorch
    pass of ``forward`` (a :class:`~amvim_mm.deploy.tasks.TaskForward`) on ATen ops that
    records the decision margins (:mod:`amvim_mm.models.reduction.margins`), or None when the
    model has no reducer that chooses by the features. There the runtimes may choose
    differently (rounding), and their outputs then differ by far more than rounding."""
    import torch
    from amvim_mm import runtime
    from amvim_mm.engine.hooks import find_reducible_backbone
    from amvim_mm.models.reduction import margins
    try:
        if find_reducible_backbone(forward.model).token_reducer is None:
            return None
    except ConfigError:          # no reducible backbone: nothing chooses tokens
        return None
    with torch.no_grad(), margins.recording() as rec, \
            runtime.override(cpu_kernels=False, reduction_kernels=False):
        forward(images)
    return None if rec.margin is None else rec.near_ties(len(images)).numpy()
