"""The compiled CPU kernels (``csrc/cpu_mixer.cpp``, ``csrc/cpu_token_merge.cpp``): build, load
and call.

The selective scan keeps the state of 8 channels in registers and walks L once per channel
block (blocks of batch x channels in parallel on ATen's thread pool): none of the (batch, E, L,
N) intermediates that set the speed of the PyTorch scan on a CPU. A second kernel runs the causal
depthwise conv + SiLU reading the tokens in a path's order. Both are inference kernels (no
backward): the scan backend ``cpu`` and the fused CPU mixer (:mod:`amvim_mm.ops.cpu_mixer`) take
them only where no autograd graph is recorded.

Build: one ``g++`` call (``$CXX``) against the installed torch's headers, as mmcv builds its CPU
ops, done by ``tools/setup_env.sh`` (``python tools/build_cpu_ops.py``) and cached in
``$AMVIM_CACHE/cpu_kernels/<key>/`` (default ``~/.cache/amvim_mm``), the key a hash of the
source, the flags, the torch and Python versions and this CPU's instruction-set flags (the code
is built for the machine, ``-march=native``). Nothing is compiled at import or at a forward: a
missing library (no compiler, or never built) falls back to the PyTorch scan with one log line
naming the fix. ``AMVIM_CPU_KERNELS=0`` switches the kernels off (for comparisons).

The third kernel is a ToMe merge step at inference (:func:`fold_merge`): the merge of the summed
stream, the compaction and the bookkeeping of
:func:`~amvim_mm.models.reduction.state.reduce_tokens` in one call (that function takes it
by itself where it applies, :func:`fold_merge_misfit`), and ToMe's edge choice is another
(:func:`tome_edges`, taken by ``ToMe.select`` where :func:`tome_edges_misfit` allows);
:func:`tome_step` chains the summed stream, the similarity, both of them in one call (taken by
``ToMe.step`` at CPU inference). The
next is a block's residual add + RMSNorm at inference (:func:`add_rmsnorm`, taken by
``VimBlock`` where :func:`add_rmsnorm_misfit` allows), the last ViL's mLSTM cell in its
parallel stabilised form (:func:`mlstm`, taken by :func:`amvim_mm.ops.mlstm.mlstm` where
:func:`amvim_mm.ops.mlstm.cpu_kernel_misfit` allows).
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import os.path as osp
import platform
import shutil
import subprocess
import sys
import tempfile
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from amvim_mm import runtime

logger = logging.getLogger('amvim_mm')

#: the sources of the one library: the mixer's kernels, ToMe's merge step, edge choice and the
#: whole step, a block's add + RMSNorm, ViL's mLSTM cell
SOURCES = tuple(osp.join(osp.dirname(osp.abspath(__file__)), 'csrc', f)
                for f in ('cpu_mixer.cpp', 'cpu_token_merge.cpp', 'cpu_add_rmsnorm.cpp',
                          'cpu_tome_edges.cpp', 'cpu_tome_step.cpp', 'cpu_mlstm.cpp'))
#: the headers they include (part of the build key)
HEADERS = tuple(osp.join(osp.dirname(osp.abspath(__file__)), 'csrc', f) for f in ('cpu_tome.h', ))
LIBRARY = 'amvim_cpu_mixer.so'
FLAGS = ('-O3', '-march=native', '-std=c++20', '-shared', '-fPIC', '-fopenmp', '-g0', '-w')


@functools.lru_cache(maxsize=None)
def _cpu_flags() -> str:
    """The instruction-set flags of this CPU (Linux), part of the build key."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith(('flags', 'Features')):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _torch_dirs() -> Tuple[List[str], str]:
    root = osp.dirname(torch.__file__)
    inc = osp.join(root, 'include')
    return [inc, osp.join(inc, 'torch', 'csrc', 'api', 'include')], osp.join(root, 'lib')


@functools.lru_cache(maxsize=None)
def build_key() -> str:
    """Hash of everything the compiled library depends on (computed once per process: it is
    asked at every mixer call)."""
    h = hashlib.sha256()
    for src in SOURCES + HEADERS:
        with open(src, 'rb') as f:
            h.update(f.read())
    for part in (FLAGS, torch.__version__, torch._C._GLIBCXX_USE_CXX11_ABI, sys.version_info[:2],
                 platform.machine(), _cpu_flags(), runtime.settings().cxx):
        h.update(repr(part).encode())
    return h.hexdigest()[:16]


def library_path() -> str:
    """Where the library for this source, torch and CPU lies (built or not)."""
    return _library_in(runtime.settings().cache_dir)


@functools.lru_cache(maxsize=None)
def _library_in(cache_dir: str) -> str:   # asked by every kernel call: joined once
    return osp.join(cache_dir, 'cpu_kernels', build_key(), LIBRARY)


def build(verbose: bool = False) -> str:
    """Compile the library into the cache (atomically; a no-op when it is there); return its
    path. Raises ``RuntimeError`` with the compiler's message when the build fails."""
    path = library_path()
    if osp.exists(path):
        return path
    cxx = runtime.settings().cxx
    if shutil.which(cxx) is None:
        raise RuntimeError(f'no C++ compiler ({cxx!r} not found; set CXX or install g++)')
    incs, libdir = _torch_dirs()
    os.makedirs(osp.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix='.so', dir=osp.dirname(path))
    os.close(fd)
    cmd = [cxx, *FLAGS, f'-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}',
           *[f'-I{i}' for i in incs], *SOURCES, '-o', tmp, f'-L{libdir}', '-lc10', '-ltorch_cpu',
           f'-Wl,-rpath,{libdir}']
    if verbose:
        print(' '.join(cmd), flush=True)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f'{cxx} failed (exit {res.returncode}): '
                               + (res.stderr.strip() or res.stdout.strip())[-2000:])
        os.replace(tmp, path)
    finally:
        if osp.exists(tmp):
            os.remove(tmp)
    return path


@functools.lru_cache(maxsize=None)
def _load(path: str) -> Tuple[bool, str]:
    if not osp.exists(path):
        return False, ('the compiled CPU kernels are not built for this torch and CPU; '
                       '`bash tools/setup_env.sh` (or `python tools/build_cpu_ops.py`) builds '
                       'them')
    try:
        torch.ops.load_library(path)
    except Exception as e:  # OSError from a broken file, RuntimeError from a double register
        return False, f'{path} does not load ({type(e).__name__}: {str(e).splitlines()[0]})'
    return True, 'ok'


_warned: set = set()


def status() -> Tuple[bool, str]:
    """(whether the compiled CPU kernels are usable, reason); loads the library once."""
    if not runtime.settings().cpu_kernels:
        return False, f'{runtime.variable_of("cpu_kernels")}=0'
    return _load(library_path())


def available() -> Tuple[bool, str]:
    """:func:`status`, and the first time the library is missing one warning names the fix
    (the PyTorch scan runs instead)."""
    ok, reason = status()
    if not ok and reason not in _warned and runtime.settings().cpu_kernels:
        _warned.add(reason)
        logger.warning('amvim_mm: %s; the CPU scan runs in PyTorch (slower)', reason)
    return ok, reason


def tracing() -> bool:
    """Whether ``torch.jit`` traces / scripts or ``torch.compile`` records: the kernels have
    no meta implementation and write into their output in place, so a recording takes the
    PyTorch ops (mmengine's FLOP counter traces the model, too)."""
    return (torch.jit.is_tracing() or torch.jit.is_scripting()
            or torch.compiler.is_compiling())


@functools.lru_cache(maxsize=None)
def vector_width() -> int:
    """Channels per vector of the built library (16 with AVX-512, else 8)."""
    return 16 if 'avx512f' in _cpu_flags().split() else 8


def grouping_fits(dim: int, groups: int) -> bool:
    """Whether the kernel takes B / C in ``groups`` groups over ``dim`` channels."""
    return groups == 1 or (dim % groups == 0 and (dim // groups) % vector_width() == 0)


def _as_f32(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.to(torch.float32).contiguous()


def selective_scan_cpu(u: Tensor,
                       delta: Tensor,
                       A: Tensor,
                       B: Tensor,
                       C: Tensor,
                       D: Optional[Tensor] = None,
                       z: Optional[Tensor] = None,
                       delta_bias: Optional[Tensor] = None,
                       delta_softplus: bool = False,
                       return_last_state: bool = False):
    """The selective scan on the compiled kernel, in mamba-ssm's layout (see
    :func:`~amvim_mm.ops.selective_scan.selective_scan_ref`): ``u, delta, z`` (batch, E, L);
    ``B, C`` (batch, N, L) or grouped (batch, G, N, L) with E / G a multiple of
    :func:`vector_width` (:func:`grouping_fits`). Computes in float32, returns ``u.dtype``.
    The channel-first inputs are copied token-major for the kernel (E times fewer numbers than
    the scan's state walk)."""
    tm = lambda t: t.to(torch.float32).transpose(-1, -2).contiguous()  # noqa: E731
    bc = lambda t: tm(t.unsqueeze(1) if t.dim() == 3 else t)  # noqa: E731   (batch, G, L, N)
    bsz, dim, length = u.shape
    out = u.new_empty(bsz, length, dim, dtype=torch.float32)
    last = torch.ops.amvim_cpu.selective_scan(
        tm(u), tm(delta), A.to(torch.float32).contiguous(), bc(B), bc(C), _as_f32(D),
        None if z is None else tm(z), _as_f32(delta_bias), delta_softplus, None, out, False,
        1.0, None)
    y = out.transpose(1, 2).to(u.dtype)
    return (y, last) if return_last_state else y


def scan_tokens(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor,
                z: Tensor, delta_bias: Tensor, order: Optional[Tensor], out: Tensor,
                accumulate: bool, scale: float, dt_proj: Optional[Tensor] = None) -> Tensor:
    """The kernel's token-major form (the fused CPU mixer's): ``u, delta`` (batch, L, E) and
    ``B, C`` (batch, L, N) in the path's order; ``z`` (batch, L, E) and ``out`` in token
    order, step ``t`` at token ``order[t]`` ((1 or batch, L) int32); ``out`` receives
    ``scale * y`` (added to it with ``accumulate``). With ``dt_proj`` (E, R), ``delta`` is
    the low-rank input (batch, L, R) and the kernel applies ``dt_proj`` per step. Returns the
    last state (batch, E, N)."""
    return torch.ops.amvim_cpu.selective_scan(u, delta, A, B.unsqueeze(1), C.unsqueeze(1), D, z,
                                              delta_bias, True, order, out, accumulate, scale,
                                              dt_proj)


def conv_silu(x: Tensor, weight: Tensor, bias: Optional[Tensor], order: Optional[Tensor],
              length: int) -> Tensor:
    """``silu(causal depthwise conv)`` of ``x`` (batch, L, E) (token-major, unit stride along E)
    read in the path's ``order`` ((1 or batch, L) int32, or None); ``weight`` (E, K).
    Returns (batch, L, E) contiguous float32 in the path's order."""
    return torch.ops.amvim_cpu.conv_silu(x, weight, bias, order, length)


def inference_misfit(*tensors: Optional[Tensor]) -> Optional[str]:
    """What every inference kernel here needs of its inputs besides their layout: no autograd
    graph through them, no trace or compile recording, the library loaded."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        return 'it has no backward'
    if tracing():
        return 'a trace or compile is recording'
    ok, reason = status()
    return None if ok else reason


def fold_merge_misfit(stream: Tensor) -> Optional[str]:
    """Why a merge step on ``stream`` cannot take :func:`fold_merge` (``None`` if it can): it
    is the inference kernel for float32 CPU tensors, outside autograd and recordings."""
    if stream.device.type != 'cpu':
        return 'not a CPU tensor'
    if stream.dtype != torch.float32:
        return 'it computes in float32'
    return inference_misfit(stream)


def fold_merge(stream: Tensor, size: Tensor, pos: Tensor, source: Tensor, removed: Tensor,
               dst: Tensor, n_patches: int, cls_index: int
               ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """One ToMe step at inference on the compiled kernel: ``removed`` (B, r) patch tokens
    merge into ``dst`` (B, r) (size-weighted average of the summed ``stream`` (B, L, D)), the
    survivors keep their order and the class token (at ``cls_index``, -1: none) goes back to
    the middle. ``size`` (B, L), ``pos`` (B, L), ``source`` (B, M): the sequence's
    bookkeeping. Returns ``(hidden, pos, size, source)`` of the reduced sequence, equal bit for
    bit to :func:`~amvim_mm.models.reduction.state.reduce_tokens` with ``fold=True`` (the
    reference)."""
    return torch.ops.amvim_cpu.fold_merge(
        stream.float().contiguous(), size.float().contiguous(), pos.long().contiguous(),
        source.long().contiguous(), removed.long().contiguous(), dst.long().contiguous(),
        int(n_patches), int(cls_index))


def add_rmsnorm_misfit(hidden: Tensor, residual: Optional[Tensor], weight: Tensor
                       ) -> Optional[str]:
    """Why a block's add + RMSNorm cannot take :func:`add_rmsnorm` (``None`` if it can): the
    inference kernel for float32 CPU tensors of one shape, outside autograd and recordings."""
    if hidden.device.type != 'cpu':
        return 'not a CPU tensor'
    if hidden.dtype != torch.float32 or weight.dtype != torch.float32 or (
            residual is not None and residual.dtype != torch.float32):
        return 'it computes in float32'
    if residual is not None and residual.shape != hidden.shape:
        return 'residual and hidden differ in shape'
    return inference_misfit(hidden, residual, weight)


def add_rmsnorm(hidden: Tensor, residual: Optional[Tensor], weight: Tensor, eps: float
                ) -> Tuple[Tensor, Tensor]:
    """``res = residual + hidden`` (``hidden`` when ``residual`` is None), then
    ``res * rsqrt(mean(res ** 2, -1) + eps) * weight``, in one pass over each (..., D) row on
    the compiled kernel. Returns ``(normed, res)``; float32 (see :func:`add_rmsnorm_misfit`)."""
    return torch.ops.amvim_cpu.add_rmsnorm(
        hidden.contiguous(), None if residual is None else residual.contiguous(),
        weight.contiguous(), float(eps))


def tome_edges_misfit(scores: Tensor) -> Optional[str]:
    """Why ToMe's edge choice on ``scores`` (B, A, Bn) cannot take :func:`tome_edges` (``None``
    if it can): float32 CPU inference outside autograd and recordings."""
    if scores.device.type != 'cpu':
        return 'not a CPU tensor'
    if scores.dtype != torch.float32 or scores.dim() != 3:
        return 'it takes (batch, A, B) float32 scores'
    return inference_misfit(scores)


def tome_edges(scores: Tensor, a_idx: Tensor, b_idx: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    """The second half of ToMe's bipartite matching for one token layout (every sample's A
    tokens ``a_idx`` (A,), B tokens ``b_idx`` (Bn,)) from the similarity ``scores`` (B, A, Bn):
    each A token's first most similar B token, the ``k`` strongest edges in a stable
    descending order. Returns ``(removed, dst)``, (B, k) int64 each, equal to
    :meth:`~amvim_mm.models.reduction.reducers.ToMe.select`'s ``max`` / ``argsort`` /
    ``gather`` ops on the same scores."""
    return torch.ops.amvim_cpu.tome_edges(scores.contiguous(), a_idx.long().contiguous(),
                                          b_idx.long().contiguous(), int(k))


def tome_step(hidden: Tensor, residual: Optional[Tensor], weight: Optional[Tensor],
              size: Tensor, pos: Tensor, source: Tensor, a_idx: Tensor, b_idx: Tensor, k: int,
              n_patches: int, cls_index: int
              ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """A whole ToMe step at CPU inference in one call: the summed stream ``residual + hidden``
    (B, L, D), the cosine similarity of its rows times ``weight`` (the block's RMSNorm weight;
    None: the raw stream) between the token sets ``a_idx`` / ``b_idx`` (every sample's
    layout), the ``k`` strongest edges and the size-weighted merge. Returns ``(hidden, pos,
    size, source, removed, dst)``: the reduced sequence's folded stream and bookkeeping, and
    the choice; bit for bit :meth:`ToMe.select <amvim_mm.models.reduction.reducers.ToMe.
    select>` followed by :func:`~amvim_mm.models.reduction.state.reduce_tokens` with
    ``fold=True`` (its similarity is PyTorch's operations, called from C++). Misfits as
    :func:`fold_merge_misfit` (float32 CPU inference)."""
    return torch.ops.amvim_cpu.tome_step(
        hidden.contiguous(), None if residual is None else residual.contiguous(),
        None if weight is None else weight.contiguous(), size.float().contiguous(),
        pos.long().contiguous(), source.long().contiguous(), a_idx, b_idx, int(k),
        int(n_patches), int(cls_index))


def mlstm(q: Tensor, k: Tensor, v: Tensor, igate: Tensor, fgate: Tensor, eps: float) -> Tensor:
    """ViL's mLSTM cell on the compiled kernel: q, k (B, NH, S, DH), v (B, NH, S, DHV) float32
    (k, v of another dtype are cast to it; any strides with a unit last one: the heads of a
    packed projection are read in place), gate
    pre-activations (B, NH, S, 1) -> h (B, NH, S, DHV) float32, equal to rounding to
    :func:`~amvim_mm.ops.mlstm.mlstm_parallel` (the reference; its row maximum taken as a
    running maximum, as the Triton kernel does). ``h`` is a view of a (B, S, NH * DHV) buffer,
    so that ``h.transpose(1, 2).reshape(B, S, -1)`` (the heads side by side) copies nothing."""
    rows = lambda t: (t if t.stride(-1) == 1 else t.contiguous()).to(torch.float32)  # noqa: E731
    B, NH, S, _ = q.shape
    h = torch.ops.amvim_cpu.mlstm(
        rows(q), rows(k), rows(v), igate.to(torch.float32).reshape(B, NH, S).contiguous(),
        fgate.to(torch.float32).reshape(B, NH, S).contiguous(), float(eps))
    return h.view(B, S, NH, -1).transpose(1, 2)
