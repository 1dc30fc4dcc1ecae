"""A per-size cache of exported graphs: one ONNX graph per image size, picked by the input's size.

Why: our exports fix the image size (the scan orders, the token grid and the chunk plan of the
scan are constants of the graph; the batch stays dynamic, docs/deploy.md), so a deployment that
sees several sizes keeps one graph per size. ``tools/deploy/export_onnx.py CONFIG CHECKPOINT
--sizes 224x224 320x256 --out DIR`` builds the folder in one command (sizes already there are
kept; ``--force`` rebuilds them): ``DIR/<H>x<W>.onnx`` and ``DIR/sizes.json``, the manifest
(config, checkpoint, reduction options, size -> file). :class:`SizeCache` opens a folder and
runs each batch on the graph of its size; a size the folder lacks is a one-line error naming the
command that adds it.
"""
from __future__ import annotations

import json
import os.path as osp
import shlex
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from amvim_mm.errors import ConfigError

#: the manifest's file name inside a cache folder
MANIFEST = 'sizes.json'


def size_key(h: int, w: int) -> str:
    """``'<H>x<W>'``: the manifest's key and the graph's file stem."""
    return f'{int(h)}x{int(w)}'


def parse_size(text: str) -> Tuple[int, int]:
    """``'320x256'`` -> (320, 256); a :class:`ConfigError` otherwise."""
    try:
        h, w = (int(v) for v in str(text).lower().split('x'))
        if h < 1 or w < 1:
            raise ValueError
    except ValueError:
        raise ConfigError(f'an image size is HxW with positive integers, e.g. 320x256; got '
                          f'{text!r}') from None
    return h, w


def read_manifest(folder: str) -> dict:
    """The manifest of ``folder`` (an empty one when the folder has none yet)."""
    path = osp.join(folder, MANIFEST)
    if not osp.exists(path):
        return dict(sizes={})
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data.get('sizes'), dict):
            raise ValueError
    except (OSError, ValueError):
        raise ConfigError(f'{path} is not a size-cache manifest (JSON with a "sizes" map); '
                          'rebuild the folder with tools/deploy/export_onnx.py --sizes') from None
    return data


def write_manifest(folder: str, data: dict) -> None:
    """Write the manifest atomically."""
    from amvim_mm.engine.fileio import atomic_write_bytes
    atomic_write_bytes(json.dumps(data, indent=1, sort_keys=True).encode(),
                       osp.join(folder, MANIFEST))


class SizeCache:
    """The graphs of one export folder, each opened in ONNX Runtime on first use.

    ``run(images)`` takes a (B, 3, H, W) array or tensor and returns the outputs of the graph
    exported at H x W; ``threads`` as :func:`~amvim_mm.deploy.ort.ort_session`."""

    def __init__(self, folder: str, threads: Optional[int] = None) -> None:
        if not osp.isdir(folder):
            raise ConfigError(f'size cache not found: {folder} (build it with '
                              'tools/deploy/export_onnx.py CONFIG CHECKPOINT --sizes HxW ... '
                              '--out FOLDER)')
        self.folder, self.threads = folder, threads
        self.manifest = read_manifest(folder)
        if not self.manifest['sizes']:
            raise ConfigError(f'{folder} holds no exported size (its {MANIFEST} is missing or '
                              'empty)')
        self._sessions: Dict[str, object] = {}

    @property
    def sizes(self) -> List[Tuple[int, int]]:
        """The (H, W) sizes the folder has graphs for, sorted."""
        return sorted(parse_size(k) for k in self.manifest['sizes'])

    def add_command(self, sizes: Sequence[str]) -> str:
        """The command that adds ``sizes`` to this folder."""
        m = self.manifest
        parts = ['python', 'tools/deploy/export_onnx.py', m.get('config', 'CONFIG'),
                 m.get('checkpoint', 'CHECKPOINT'), *m.get('extra_args', []),
                 '--sizes', *sizes, '--out', self.folder]
        return ' '.join(shlex.quote(str(p)) for p in parts)

    def session(self, h: int, w: int):
        """The ONNX Runtime session of the graph exported at ``h`` x ``w``."""
        from .ort import ort_session
        key = size_key(h, w)
        if key not in self.manifest['sizes']:
            have = ', '.join(size_key(*s) for s in self.sizes)
            raise ConfigError(f'no graph for {key} in {self.folder} (it has {have}); add it: '
                              f'{self.add_command([key])}')
        if key not in self._sessions:
            self._sessions[key] = ort_session(
                osp.join(self.folder, self.manifest['sizes'][key]), self.threads)
        return self._sessions[key]

    def run(self, images) -> List[np.ndarray]:
        """The outputs of the graph of ``images``' size (B, 3, H, W)."""
        from .ort import run_onnx
        h, w = images.shape[-2:]
        return run_onnx(self.session(h, w), images)
