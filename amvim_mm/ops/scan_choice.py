"""The fused mixer's launch configuration and its automatic choice of the scan.

``scan_config``: the scan kernels' (BLOCK_E, num_warps, dt_in_kernel) per inner width.
``auto_scan_choice``: which of the sequential fused scan, the chunked fused scan and the
mamba-ssm kernels runs a mixer call, from a table measured per batch x E x L
(:data:`SCAN_CHOICE_TABLE`) or, outside it, a rule on the number of programs
(:func:`rule_scan_choice`). Imports no Triton: the backbones' execution plan consults it too.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

from amvim_mm import runtime

__all__ = ['SCAN_CHOICE_TABLE', 'SCAN_TABLE_PATHS', 'TARGET_PROGRAMS', 'CHUNK_MIN_LEN',
           'CHUNK_SIZES', 'SCAN_CONFIGS', 'DEFAULT_SCAN_CONFIG', 'scan_config',
           'rule_scan_choice', 'table_scan_choice', 'auto_scan_choice', 'auto_prefers_fused',
           'choice_chunk', 'auto_scan_chunk']

# Launch configuration of the scan kernel per inner width E: (BLOCK_E, num_warps, DT_IN_KERNEL),
# from the tune part of tools/benchmark.py on an H200 (benchmarks/README.md); other widths
# use DEFAULT_SCAN_CONFIG. Environment override: AMVIM_FUSED_SCAN_CONFIG="32,1,1".
# (64, 2, dt as matmul) was best for both widths; dt_proj inside the kernel is much slower for
# Vim-S (R = 24, padded to 32).
SCAN_CONFIGS = {384: (64, 2, False), 768: (64, 2, False)}
DEFAULT_SCAN_CONFIG = (64, 2, False)


def scan_config(E: int) -> Tuple[int, int, bool]:
    """(BLOCK_E, num_warps, dt_in_kernel) of the scan kernels for inner width E:
    ``AMVIM_FUSED_SCAN_CONFIG`` when set, else :data:`SCAN_CONFIGS` (or the default)."""
    env = runtime.settings().scan_config    # AMVIM_FUSED_SCAN_CONFIG
    if env is not None:
        be, w, dk = env
        return be, w, bool(dk)
    return SCAN_CONFIGS.get(E, DEFAULT_SCAN_CONFIG)


# The automatic choice of the scan (see ``auto_scan_choice``): which of the sequential fused scan
# ('seq'), the chunked fused scan with chunk length T ('chunkT') and the mamba-ssm kernels on
# the unfused path ('mamba') is fastest, per shape bucket (E, L) -> {batch: choice}, measured on
# one H200 by ``python tools/benchmark.py --suite gpu --parts tune-chunk`` (bf16, CUDA graph, one
# mixer call with P = 2 paths), which prints this literal ready to paste.
#
# E = 384 (Vim-T, AMVim-T): measured in benchmarks/runs/2026-12-01_run37 (T in 32, 64, 128; the
# fused scans beat the mamba-ssm mixer at every measured shape). E = 768
# (Vim-S): not measured yet, the fallback rule (``rule_scan_choice``) evaluated at the table's
# points: chunked where the sequential grid has fewer than TARGET_PROGRAMS programs and
# L >= CHUNK_MIN_LEN, else sequential.
SCAN_CHOICE_TABLE: Dict[Tuple[int, int], Dict[int, str]] = {
    (384, 197): {1: 'chunk32', 2: 'chunk32', 8: 'chunk32', 32: 'seq', 128: 'seq'},
    (384, 1025): {1: 'chunk32', 2: 'chunk32', 8: 'chunk32', 32: 'chunk128', 128: 'seq'},
    (384, 4097): {1: 'chunk64', 2: 'chunk128', 8: 'chunk128', 32: 'chunk128'},
    (768, 197): {1: 'seq', 2: 'seq', 4: 'seq', 8: 'seq', 16: 'seq', 32: 'seq', 128: 'seq'},
    (768, 1025): {1: 'chunk32', 2: 'chunk64', 4: 'chunk128', 8: 'chunk256', 16: 'chunk256',
                  32: 'seq', 128: 'seq'},
    (768, 2305): {1: 'chunk64', 2: 'chunk128', 4: 'chunk256', 8: 'chunk256', 16: 'chunk256',
                  32: 'seq', 128: 'seq'},
    (768, 4097): {1: 'chunk128', 2: 'chunk256', 4: 'chunk256', 8: 'chunk256', 16: 'chunk256',
                  32: 'seq', 128: 'seq'},
}
#: the number of paths the table was measured with (other P: the fallback rule)
SCAN_TABLE_PATHS = 2
#: the fallback rule's target grid: 4 programs per SM of an H200 (132 SMs)
TARGET_PROGRAMS = 4 * 132
#: the fallback rule chunks only sequences at least this long
CHUNK_MIN_LEN = 512
#: the chunk lengths the rule and the tune-chunk part consider
CHUNK_SIZES = (32, 64, 128, 256)


def rule_scan_choice(batch: int, d_inner: int, seq_len: int, num_paths: int = 2) -> str:
    """The fallback rule of the automatic scan choice (shapes outside ``SCAN_CHOICE_TABLE``).

    The sequential scan has ``batch * ceil(E / BLOCK_E) * P`` programs, each walking L steps.
    Below ``TARGET_PROGRAMS`` programs and for ``L >= CHUNK_MIN_LEN`` the chunked scan is taken
    with the largest T of ``CHUNK_SIZES`` whose grid (times ``ceil(L / T)`` chunks) reaches
    ``TARGET_PROGRAMS`` (else the smallest T); otherwise the sequential scan. Never 'mamba'.
    """
    block_e = min(scan_config(d_inner)[0], 1 << max(d_inner - 1, 0).bit_length())
    programs = batch * -(-d_inner // block_e) * num_paths
    if seq_len < CHUNK_MIN_LEN or programs >= TARGET_PROGRAMS:
        return 'seq'
    for T in sorted(CHUNK_SIZES, reverse=True):
        if programs * -(-seq_len // T) >= TARGET_PROGRAMS:
            return f'chunk{T}'
    return f'chunk{min(CHUNK_SIZES)}'


def _nearest(points, value: float) -> int:
    """The point nearest to ``value`` in log scale (ties: the larger point)."""
    return min(sorted(points, reverse=True), key=lambda v: abs(math.log(v / value)))


def table_scan_choice(batch: int, d_inner: int, seq_len: int, num_paths: int = 2
                      ) -> Optional[str]:
    """``SCAN_CHOICE_TABLE``'s entry for a shape, or None when the shape lies outside it.

    A shape is inside when the table was measured with its P (``SCAN_TABLE_PATHS``) and its E
    exactly, its L lies within a factor 2 of the table's lengths for that E, and its batch
    within a factor 2 of the batches of the row at the nearest L; it then takes that row's
    entry at the nearest batch (nearest in log scale; ties: the larger).
    """
    if num_paths != SCAN_TABLE_PATHS or batch < 1 or seq_len < 1:
        return None
    lens = [L for E, L in SCAN_CHOICE_TABLE if E == d_inner]
    if not lens or not min(lens) / 2 <= seq_len <= 2 * max(lens):
        return None
    row = SCAN_CHOICE_TABLE[(d_inner, _nearest(lens, seq_len))]
    if not row or not min(row) / 2 <= batch <= 2 * max(row):
        return None
    return row[_nearest(row, batch)]


def auto_scan_choice(batch: int, d_inner: int, seq_len: int, num_paths: int = 2,
                     has_mamba_kernel: bool = True) -> str:
    """The automatic choice of the scan: 'seq', 'chunkT' or 'mamba'.

    ``SCAN_CHOICE_TABLE`` for shapes inside it (:func:`table_scan_choice`), else
    :func:`rule_scan_choice`; a 'mamba' entry without the mamba-ssm kernel installed becomes the
    rule's choice.
    """
    choice = table_scan_choice(batch, d_inner, seq_len, num_paths)
    if choice is None or (choice == 'mamba' and not has_mamba_kernel):
        choice = rule_scan_choice(batch, d_inner, seq_len, num_paths)
    return choice


def auto_prefers_fused(batch: int, d_inner: int, has_mamba_kernel: bool, seq_len: int,
                       num_paths: int = 2) -> bool:
    """The automatic choice between the fused path and the mamba-ssm kernels: fused unless
    :func:`auto_scan_choice` says 'mamba' (never without the mamba-ssm kernel)."""
    return auto_scan_choice(batch, d_inner, seq_len, num_paths, has_mamba_kernel) != 'mamba'


def choice_chunk(choice: str) -> int:
    """The chunk length of a scan choice: 0 for 'seq' (and 'mamba'), T for 'chunkT'."""
    return int(choice[len('chunk'):]) if choice.startswith('chunk') else 0


def auto_scan_chunk(batch: int, d_inner: int, seq_len: int, num_paths: int) -> int:
    """The fused scan :func:`launch_scan` takes with ``chunk=None``: ``AMVIM_FUSED_SCAN_CHUNK``
    (``runtime.settings().scan_chunk``) when set, else :func:`auto_scan_choice` on the fused
    path (a 'mamba' entry counts as the rule's choice); 0 (sequential) whenever the scan
    configuration computes ``dt_proj`` in the kernel (the chunked kernels do not)."""
    if scan_config(d_inner)[2]:
        return 0
    setting = runtime.settings().scan_chunk
    if setting is not None:
        return setting
    return choice_chunk(auto_scan_choice(batch, d_inner, seq_len, num_paths,
                                         has_mamba_kernel=False))
