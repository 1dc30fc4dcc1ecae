"""Environment report and checks behind ``tools/check_env.py``."""
from __future__ import annotations

import importlib
import importlib.metadata as md
from typing import Dict, List, Tuple

# package -> version pinned in requirements.txt (checked when present)
PINNED = {
    'torch': '2.14.1',
    'torchvision': '0.29.1',
    'numpy': '2.3.5',
    'mmengine': '0.10.7',
    'mmcv': '2.1.0',
    'mmsegmentation': '1.2.2',
    'mmdet': '3.3.0',
    'mmpretrain': '1.2.0',
    'timm': '1.0.31',
}

FIX = 'run `bash tools/setup_env.sh` (AMVIM_FORCE_SETUP=1 to redo every step)'


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return 'not installed'


def collect_env() -> Tuple[Dict[str, str], List[str]]:
    """Return (report, problems). ``problems`` is empty for a healthy install."""
    info: Dict[str, str] = {}
    problems: List[str] = []
    import sys
    info['python'] = sys.version.split()[0]
    try:
        import torch
        info['torch'] = torch.__version__
        info['cuda (torch build)'] = str(torch.version.cuda)
        info['cuda available'] = str(torch.cuda.is_available())
        if torch.cuda.is_available():
            info['gpu'] = torch.cuda.get_device_name(0)
    except Exception as e:  # pragma: no cover - reported
        problems.append(f'torch does not import ({e}); {FIX}')
    for dist in ('torchvision', 'numpy', 'mmengine', 'mmcv', 'mmsegmentation', 'mmdet',
                 'mmpretrain', 'timm'):
        v = _version(dist)
        info[dist] = v
        want = PINNED.get(dist)
        if v == 'not installed':
            problems.append(f'{dist} is not installed; {FIX}')
        elif want and v.split('+')[0] != want:
            problems.append(f'{dist} {v} is installed but {want} is pinned; {FIX}')
    # mmcv compiled ops (RoIAlign, nms) are needed by mmdet's detectors.
    try:
        ext = importlib.import_module('mmcv._ext')
        info['mmcv ops'] = 'compiled' if hasattr(ext, 'nms') else 'missing nms'
    except Exception as e:
        info['mmcv ops'] = f'not compiled ({type(e).__name__})'
        problems.append('mmcv was installed without its compiled ops (mmcv._ext); '
                        'delete the cached mmcv wheel and ' + FIX)
    for mod in ('mmseg', 'mmdet', 'mmpretrain'):
        try:
            importlib.import_module(mod)
        except Exception as e:
            problems.append(f'`import {mod}` fails: {str(e).splitlines()[0][:200]}; {FIX}')
    if _version('transformers') != 'not installed':
        problems.append(
            'transformers is installed: mmpretrain then imports its multimodal models, which '
            'break with transformers >= 4.52; `pip uninstall transformers` (it is not needed)')
    try:
        import amvim_mm  # noqa: F401
        info['amvim_mm'] = amvim_mm.__version__
    except Exception as e:
        problems.append(f'`import amvim_mm` fails: {e}; {FIX}')
    from amvim_mm.ops.backends import (causal_conv1d_kernel, mamba_selective_scan,
                                       requested_backend)
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
    from amvim_mm.ops import cpu_ops
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
    from amvim_mm.ops.fused_mixer import fused_mixer_available, fused_requested
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
    from amvim_mm.utils.safe_load import retired_env_problems
    problems.extend(retired_env_problems())
    return info, problems
