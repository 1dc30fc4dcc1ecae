"""Faster ``package::`` lookups while mmengine parses a config (compat shim 3, see
:mod:`amvim_mm.utils.compat`).

mmengine 0.10.7 resolves every ``mmseg::`` / ``mmdet::`` / ``mmpretrain::`` base of a config by
parsing *all* the package's ``metafile.yml`` files with the pure-Python YAML loader
(``mmengine.config.utils._get_cfg_metainfo``, every metafile of mmseg), and a base under
``_base_/`` is not even in them: the lookup fails and falls back to the plain path. It also
reloads ``pkg_resources`` for every such base (``is_installed``). Our configs pull three or
four bases from the libraries, so one ``load_config`` spent most of its time there, in every
tool start and every config test.

:func:`cached_package_lookups` replaces those two functions for the duration of one parse with
versions that read each package's index once per process (same results and the same
``ValueError`` for a name the index lacks, which mmengine catches; a package installed while a
process runs is not seen by it). The originals are restored on exit; nothing of mmengine is
edited on disk.
"""
from __future__ import annotations

import contextlib
import functools
import os.path as osp
import warnings
from typing import Dict, Iterator

import mmengine.config.config as _mm_config
import mmengine.config.utils as _mm_utils
from mmengine.fileio import load


@functools.lru_cache(maxsize=None)
def _config_index(package_path: str) -> Dict[str, dict]:
    """Every config a package's model index names -> its metafile entry (the first one of a
    config with several weights), as ``_get_cfg_metainfo`` collects them."""
    meta_index = load(osp.join(package_path, '.mim', 'model-index.yml'))
    index: Dict[str, dict] = {}
    for meta_path in meta_index['Import']:
        for model_cfg in load(osp.join(package_path, '.mim', meta_path))['Models']:
            if 'Config' not in model_cfg:
                warnings.warn(f'There is not `Config` define in {model_cfg}')
                continue
            index.setdefault(model_cfg['Config'].partition('/')[-1], model_cfg)
    return index


def _cfg_metainfo(package_path: str, cfg_path: str) -> dict:
    index = _config_index(package_path)
    if cfg_path not in index:
        raise ValueError(f'Expected configs: {index.keys()}, but got {cfg_path}')
    return index[cfg_path]


@functools.lru_cache(maxsize=None)
def _is_installed(package: str) -> bool:
    return _ORIGINAL_IS_INSTALLED(package)


_ORIGINAL_IS_INSTALLED = _mm_config.is_installed


@contextlib.contextmanager
def cached_package_lookups() -> Iterator[None]:
    """Within the block, mmengine's config parser looks packages and their model indexes up
    once per process (see the module doc)."""
    saved = _mm_utils._get_cfg_metainfo, _mm_config.is_installed
    _mm_utils._get_cfg_metainfo, _mm_config.is_installed = _cfg_metainfo, _is_installed
    try:
        yield
    finally:
        _mm_utils._get_cfg_metainfo, _mm_config.is_installed = saved
