"""Environment report and checks behind ``tools/check_env.py``: the versions that matter
against the pins, mmcv's compiled ops, the OpenMMLab imports. The state of our kernels needs
:mod:`amvim_mm.ops`, a layer above this one: the caller adds it as a section
(:func:`amvim_mm.bench.environment.collect_env` does)."""
from __future__ import annotations

import importlib
import importlib.metadata as md
import re
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

#: the checkout (the pins are read from its requirement files when they are there)
ROOT = Path(__file__).resolve().parents[2]
#: the direct pins (``name==version`` lines) that ``tools/setup_env.sh`` installs
REQUIREMENT_FILES = ('requirements.txt', 'requirements/gpu.txt')
#: mmcv is built from its sdist by this script (no wheel for our torch), pinned in it
MMCV_PIN = ('tools/setup_env.sh', re.compile(r'^MMCV_VERSION=["\']?([^\s"\']+)', re.M))
_PIN = re.compile(r'^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([^\s;#,]+)')
#: the distributions whose installed version is reported and checked against its pin
CHECKED = ('torchvision', 'numpy', 'mmengine', 'mmcv', 'mmsegmentation', 'mmdet', 'mmpretrain',
           'timm')

FIX = 'run `bash tools/setup_env.sh` (AMVIM_FORCE_SETUP=1 to redo every step)'

#: one part of the report: adds its lines to ``info`` (it may read the lines before it) and
#: returns its problems
Section = Callable[[Dict[str, str]], List[str]]


def _canonical(name: str) -> str:
    return re.sub(r'[-_.]+', '-', name).lower()


def read_pins(root: Path = ROOT) -> Optional[Dict[str, str]]:
    """Distribution (canonical name) -> pinned version, from ``root``'s requirement files
    (:data:`REQUIREMENT_FILES`) and mmcv's from ``tools/setup_env.sh``; None when
    ``requirements.txt`` is not there (an installed package without its source tree)."""
    root = Path(root)
    if not (root / REQUIREMENT_FILES[0]).is_file():
        return None
    pins: Dict[str, str] = {}
    for name in REQUIREMENT_FILES:
        path = root / name
        if path.is_file():
            for line in path.read_text().splitlines():
                m = _PIN.match(line)
                if m:
                    pins[_canonical(m.group(1))] = m.group(2)
    script, pattern = MMCV_PIN
    m = pattern.search((root / script).read_text()) if (root / script).is_file() else None
    if m:
        pins['mmcv'] = m.group(1)
    return pins


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


def _versions(info: Dict[str, str], root: Path) -> List[str]:
    pins = read_pins(root)
    info['version pins'] = (
        f'{", ".join(REQUIREMENT_FILES)}, {MMCV_PIN[0]} (mmcv)' if pins is not None else
        f'not checked: no {REQUIREMENT_FILES[0]} in {root} (an installed package without '
        'its source tree)')
    problems = []
    for dist in CHECKED:
        v = _version(dist)
        info[dist] = v
        want = (pins or {}).get(_canonical(dist))
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


def collect_env(kernels: Optional[Section] = None, root: Optional[Path] = None
                ) -> Tuple[Dict[str, str], List[str]]:
    """Return (report, problems). ``problems`` is empty for a healthy install. ``kernels``:
    the section on our kernels (:func:`amvim_mm.bench.environment.kernel_report`), placed
    after the imports; ``root``: the checkout whose requirement files hold the pins (default
    :data:`ROOT`)."""
    info: Dict[str, str] = {'python': sys.version.split()[0]}
    problems: List[str] = []
    root = ROOT if root is None else Path(root)
    sections = (_torch, lambda i: _versions(i, root), _mmcv_ops, _imports)
    for section in sections + ((kernels, ) if kernels else ()):
        problems += section(info)
    from amvim_mm.utils.safe_load import retired_env_problems
    problems.extend(retired_env_problems())
    return info, problems
