"""The environment report of ``tools/check_env.py``: :func:`amvim_mm.utils.env.collect_env`
with the state of our kernels (mamba-ssm, causal-conv1d, the compiled CPU kernels, the fused
mixer) and the path the switches and this machine give the scan and the mixer."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

from amvim_mm.utils import env


def _scan(info: Dict[str, str]) -> Tuple[List[str], bool]:
    """The scan kernels and the backend the scan runs on; (problems, whether the compiled CPU
    kernels are usable)."""
    from amvim_mm.ops import cpu_ops
    from amvim_mm.ops.backends import (causal_conv1d_kernel, mamba_selective_scan,
                                       requested_backend)
    problems: List[str] = []
    fn, why = mamba_selective_scan()
    info['mamba-ssm kernel'] = 'usable' if fn is not None else f'not usable ({why})'
    cfn, cwhy = causal_conv1d_kernel()
    info['causal-conv1d kernel'] = 'usable' if cfn is not None else f'not usable ({cwhy})'
    try:
        req = requested_backend()
    except ValueError as e:
        problems.append(str(e))
        req = 'invalid'
    cuda = info.get('cuda available') == 'True'
    try:
        cpu_ok, cpu_why = cpu_ops.status()
    except ValueError as e:
        problems.append(str(e))
        cpu_ok, cpu_why = False, 'invalid setting'
    info['compiled CPU kernels'] = 'usable' if cpu_ok else f'not usable ({cpu_why})'
    if req == 'auto':
        scan = 'cuda (mamba-ssm)' if (cuda and fn is not None) else (
            'cpu (compiled kernel; torch under autograd)' if cpu_ok else
            'torch (chunked PyTorch scan)')
    else:
        scan = f'{req} (forced by AMVIM_SCAN_BACKEND)'
        if req == 'cuda' and not (cuda and fn is not None):
            problems.append('AMVIM_SCAN_BACKEND=cuda but the mamba-ssm kernel is not usable here '
                            f'({"no CUDA device" if not cuda else why}): every forward would '
                            'fail; unset it or use torch')
        if req == 'cpu' and not cpu_ok:
            problems.append(f'AMVIM_SCAN_BACKEND=cpu but the compiled CPU kernels are not usable '
                            f'({cpu_why}): every forward would fail; unset it or use torch')
    info['scan backend'] = scan
    return problems, cpu_ok


def _fused_mixer(info: Dict[str, str], cpu_ok: bool) -> List[str]:
    """The fused mixer: switched off, usable, forced but not usable, or what runs instead."""
    from amvim_mm.ops.fused_mixer import fused_mixer_available, fused_requested
    problems: List[str] = []
    try:
        fused = fused_requested(None)
    except ValueError as e:
        problems.append(str(e))
        fused = False
    ok, fwhy = fused_mixer_available('cuda')
    if fused is False:
        info['fused mixer (inference)'] = 'off (AMVIM_FUSED_MIXER=0)'
    elif ok:
        info['fused mixer (inference)'] = 'usable (Triton, CUDA)'
    elif fused is True:
        info['fused mixer (inference)'] = f'forced by AMVIM_FUSED_MIXER=1 but not usable ({fwhy})'
        problems.append(f'AMVIM_FUSED_MIXER=1 but the fused mixer is not usable here ({fwhy}): '
                        'every inference would fail; unset it or set 0')
    else:
        info['fused mixer (inference)'] = f'Triton not usable here ({fwhy}); ' + (
            'the fused CPU mixer runs (compiled kernels)' if cpu_ok else 'the unfused mixer runs')
    return problems


def kernel_report(info: Dict[str, str]) -> List[str]:
    """The kernels' section of the report (reads ``info['cuda available']``); its problems."""
    problems, cpu_ok = _scan(info)
    return problems + _fused_mixer(info, cpu_ok)


def collect_env(root: Optional[Path] = None) -> Tuple[Dict[str, str], List[str]]:
    """(report, problems) of :func:`amvim_mm.utils.env.collect_env` with the kernels'
    section; ``problems`` is empty for a healthy install; ``root``: the checkout whose
    requirement files hold the pins (default: this one)."""
    return env.collect_env(kernels=kernel_report, root=root)
