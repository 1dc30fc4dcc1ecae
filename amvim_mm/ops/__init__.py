from .backends import SCAN_BACKENDS, resolve_scan_backend
from .causal_conv1d import CONV_BACKENDS, causal_conv1d_fn, causal_conv1d_torch
from .selective_scan import (aligned_selective_scan, gap_deltas_from_mask, kept_indices,
                             selective_scan_fn, selective_scan_ref, selective_scan_torch)

__all__ = [
    'SCAN_BACKENDS', 'resolve_scan_backend', 'CONV_BACKENDS', 'causal_conv1d_fn',
    'causal_conv1d_torch', 'selective_scan_fn', 'selective_scan_ref', 'selective_scan_torch',
    'aligned_selective_scan', 'gap_deltas_from_mask', 'kept_indices'
]
