"""Environment report and checks behind ``tools/check_env.py``: the versions that matter
against the pins, mmcv's compiled ops, the OpenMMLab imports. The state of our kernels needs
:mod:`amvim_mm.ops`, a layer above this one: the caller adds it as a section
(:func:`amvim_mm.bench.environment.collect_env` does)."""
from __future__ import annotations

import importlib
import importlib.metadata as md
import sys
from typing import Callable, Dict, List, Optional, Tuple

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
#: the distributions whose installed version is reported and checked against its pin
CHECKED = ('torchvision', 'numpy', 'mmengine', 'mmcv', 'mmsegmentation', 'mmdet', 'mmpretrain',
           'timm')

FIX = 'run `bash tools/setup_env.sh` (AMVIM_FORCE_SETUP=1 to redo every step)'

#: one part of the report: adds its lines to ``info`` (it may read the lines before it) and
#: returns its problems
Section = Callable[[Dict[str, str]], List[str]]


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return 'not installed'


def _torch(info: Dict[str, str]) -> List[str]:
    try:
        import torch
        info['torch'] = torch.__version__
        info['cuda (torch build)'] = str(torch.version.cuda)
        info['cuda available'] = str(torch.cuda.is_available())
        if torch.cuda.is_available():
            info['gpu'] = torch.cuda.get_device_name(0)
    except Exception as e:  # pragma: no cover - reported
        return [f'torch does not import ({e}); {FIX}']
    return []


def _versions(info: Dict[str, str]) -> List[str]:
    problems = []
    for dist in CHECKED:
        v = _version(dist)
        info[dist] = v
        want = PINNED.get(dist)
        if v == 'not installed':
            problems.append(f'{dist} is not installed; {FIX}')
        elif want and v.split('+')[0] != want:
            problems.append(f'{dist} {v} is installed but {want} is pinned; {FIX}')
    return problems


def _mmcv_ops(info: Dict[str, str]) -> List[str]:
    """mmcv's compiled ops (RoIAlign, nms): mmdet's detectors need them."""
    try:
        ext = importlib.import_module('mmcv._ext')
        info['mmcv ops'] = 'compiled' if hasattr(ext, 'nms') else 'missing nms'
    except Exception as e:
        info['mmcv ops'] = f'not compiled ({type(e).__name__})'
        return ['mmcv was installed without its compiled ops (mmcv._ext); '
                'delete the cached mmcv wheel and ' + FIX]
    return []


def _imports(info: Dict[str, str]) -> List[str]:
    """The OpenMMLab libraries import; no transformers to break mmpretrain; our package."""
    problems = []
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
    return problems


def collect_env(kernels: Optional[Section] = None) -> Tuple[Dict[str, str], List[str]]:
    """Return (report, problems). ``problems`` is empty for a healthy install. ``kernels``:
    the section on our kernels (:func:`amvim_mm.bench.environment.kernel_report`), placed
    after the imports."""
    info: Dict[str, str] = {'python': sys.version.split()[0]}
    problems: List[str] = []
    for section in (_torch, _versions, _mmcv_ops, _imports) + ((kernels, ) if kernels else ()):
        problems += section(info)
    from amvim_mm.utils.safe_load import retired_env_problems
    problems.extend(retired_env_problems())
    return info, problems
