"""Checkpoints named by URL or prefix (``https://``, ``torchvision://``, ``open-mmlab://``,
``mmcls://``, ``s3://``...), read through the same allow-list loader as local files.

mmengine serves these names with ``torch.hub.load_state_dict_from_url`` or a bare ``torch.load``,
both of which unpickle fully (``weights_only`` off). Here a name is resolved the way mmengine
and torch.hub resolve it: mmengine's model tables (``get_torchvision_models``,
``get_external_models``, ``get_mmcls_models``, ``get_deprecated_model_names``) turn a prefixed
name into a URL, and a URL is the file ``torch.hub.get_dir()/checkpoints/<the URL's file
name>`` (or ``model_dir``), downloaded only when that cache lacks it (rank 0 first in a
distributed run, as mmengine does). The cached file is then read by
:func:`~amvim_mm.utils.safe_load.load_checkpoint_file`, so ``AMVIM_UNSAFE_LOAD`` names it by its
path in the cache. Ceph/petrel and pavi objects are copied to a temporary file and read the
same way.

:data:`SCHEMES` has a loader for every prefix mmengine registers (mmseg, mmdet and mmpretrain
register none); :func:`amvim_mm.utils.compat.register_checkpoint_loader` puts them in mmengine's
``CheckpointLoader``, and :func:`load_checkpoint` dispatches a name for our own backbones.
"""
from __future__ import annotations

import logging
import os
import re
import tempfile
import zipfile
from typing import Any, Callable, Dict, Mapping, Optional
from urllib.parse import urlparse

import torch
from mmengine.dist import barrier, get_dist_info
from mmengine.logging import print_log
from mmengine.runner.checkpoint import (_get_mmengine_home, _process_mmcls_checkpoint,
                                        get_deprecated_model_names, get_external_models,
                                        get_mmcls_models, get_torchvision_models)

from amvim_mm.errors import CheckpointError, first_line
from .safe_load import load_checkpoint_file


def _download(url: str, path: str, progress: bool) -> None:
    """Fetch ``url`` into ``path`` with torch.hub's downloader (it writes a temporary file and
    moves it into place, so an interrupted download leaves no partial file)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    print_log(f'Downloading {url} to {path}', logger='current')
    try:
        torch.hub.download_url_to_file(url, path, progress=progress)
    except Exception as err:   # URLError, HTTPError, OSError ...
        raise CheckpointError(f'{url}: download failed ({first_line(err)}); to use the file '
                              f'without a download, put it at {path}') from None


def cached_file(url: str, model_dir: Optional[str] = None, progress: bool = False) -> str:
    """The local copy of ``url`` where torch.hub keeps it, downloaded if missing."""
    name = os.path.basename(urlparse(url).path)
    if not name:
        raise CheckpointError(f'{url}: the URL names no file')
    path = os.path.join(model_dir or os.path.join(torch.hub.get_dir(), 'checkpoints'), name)
    rank, world_size = get_dist_info()
    if rank == 0 and not os.path.exists(path):
        _download(url, path, progress)
    if world_size > 1:
        barrier()
        if rank > 0 and not os.path.exists(path):
            _download(url, path, progress)
    return path


def _member_problem(member: zipfile.ZipInfo) -> Optional[str]:
    """Why a zip member may not be extracted (None: it may): absolute paths, ``..``, drive
    letters, backslashes and links could write outside the folder it is given."""
    name = member.filename
    mode = (member.external_attr >> 16) & 0o170000
    if mode == 0o120000:
        return 'is a symbolic link'
    if name.startswith(('/', '\\')) or re.match(r'^[A-Za-z]:', name) or '\\' in name:
        return 'has an absolute or Windows path'
    if any(part in ('', '.', '..') for part in name.split('/')):
        return 'has an empty, "." or ".." path part'
    return None


def _unpacked(path: str) -> str:
    """torch.hub's old download format, a zip holding one file (a ``torch.save`` zip holds
    several): that file, extracted into a folder of its own next to the zip, named by the
    zip's SHA-256 (``.<zip name>.<digest>.unpacked/``). It is never written over an existing
    file: a member named like another cached checkpoint, or like a file trusted with
    ``AMVIM_UNSAFE_LOAD``, cannot replace it. A member that could escape its folder (absolute
    path, ``..``, a link) is refused."""
    import hashlib
    import shutil
    import zlib
    if not zipfile.is_zipfile(path):
        return path
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
        if len(members) != 1 or members[0].is_dir():
            return path
        member = members[0]
        problem = _member_problem(member)
        if problem is not None:
            raise CheckpointError(f'{path}: refusing the zip: its member {member.filename!r} '
                                  f'{problem}')
        digest = hashlib.sha256()
        with open(path, 'rb') as f:
            for block in iter(lambda: f.read(1 << 20), b''):
                digest.update(block)
        folder = os.path.join(os.path.dirname(path), f'.{os.path.basename(path)}.'
                                                     f'{digest.hexdigest()[:16]}.unpacked')
        target = os.path.join(folder, *member.filename.split('/'))
        if os.path.isfile(target) and not os.path.islink(target):
            crc = 0
            with open(target, 'rb') as f:
                for block in iter(lambda: f.read(1 << 20), b''):
                    crc = zlib.crc32(block, crc)
            if crc == member.CRC and os.path.getsize(target) == member.file_size:
                return target                  # extracted before from this very zip
        # a fresh folder of its own, moved into place whole (never over an existing one)
        fresh = tempfile.mkdtemp(prefix='.unpacking-', dir=os.path.dirname(path))
        try:
            archive.extract(member, fresh)
            try:
                os.rename(fresh, folder)
                return target
            except OSError:                    # a folder of that name exists: keep it, use ours
                return os.path.join(fresh, *member.filename.split('/'))
        except BaseException:
            shutil.rmtree(fresh, ignore_errors=True)
            raise


def load_from_http(filename: str, map_location: Any = None, model_dir: Optional[str] = None,
                   progress: bool = os.isatty(0)) -> Any:
    """A checkpoint by URL, from torch.hub's cache (see the module docstring)."""
    path = _unpacked(cached_file(filename, model_dir, progress))
    return load_checkpoint_file(path, map_location=map_location, origin=filename)


def _url_of(table: Mapping[str, str], name: str, filename: str) -> str:
    if name not in table:
        raise CheckpointError(f'{filename}: unknown model name {name!r} (mmengine\'s table of '
                              'this prefix has no such entry)')
    return table[name]


def load_from_torchvision(filename: str, map_location: Any = None) -> Any:
    """``torchvision://NAME`` (or the deprecated ``modelzoo://NAME``)."""
    name = filename.split('://', 1)[1]
    return load_from_http(_url_of(get_torchvision_models(), name, filename), map_location)


def load_from_openmmlab(filename: str, map_location: Any = None) -> Any:
    """``open-mmlab://NAME`` or ``openmmlab://NAME``: a URL, or a file under mmengine's home."""
    prefix, name = filename.split('://', 1)
    deprecated = get_deprecated_model_names()
    if name in deprecated:
        print_log(f'{prefix}://{name} is deprecated in favor of {prefix}://{deprecated[name]}',
                  logger='current', level=logging.WARNING)
        name = deprecated[name]
    url = _url_of(get_external_models(), name, filename)
    if url.startswith(('http://', 'https://')):
        return load_from_http(url, map_location)
    return load_checkpoint_file(os.path.join(_get_mmengine_home(), url),
                                map_location=map_location)


def load_from_mmcls(filename: str, map_location: Any = None) -> Any:
    """``mmcls://NAME``, with mmengine's post-processing (the backbone's weights only)."""
    url = _url_of(get_mmcls_models(), filename[len('mmcls://'):], filename)
    return _process_mmcls_checkpoint(load_from_http(url, map_location))


def _load_copy(filename: str, data: bytes, map_location: Any) -> Any:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, os.path.basename(filename) or 'checkpoint')
        with open(path, 'wb') as f:
            f.write(data)
        return load_checkpoint_file(path, map_location=map_location, origin=filename,
                                    temporary=True)


def load_from_ceph(filename: str, map_location: Any = None, backend: str = 'petrel') -> Any:
    """``s3://`` or ``petrel://`` (optionally ``NAME:s3://``), read through mmengine's fileio."""
    from mmengine.fileio import get_file_backend
    try:
        data = get_file_backend(filename, backend_args={'backend': backend}).get(filename)
    except Exception as err:   # ImportError of petrel_client, access errors ...
        raise CheckpointError(f'{filename}: cannot read it ({first_line(err)})') from None
    return _load_copy(filename, data, map_location)


def load_from_pavi(filename: str, map_location: Any = None) -> Any:
    """``pavi://PATH``, downloaded with pavi's model cloud."""
    try:
        from pavi import modelcloud
    except ImportError:
        raise CheckpointError(f'{filename}: pavi:// needs the pavi package, which is not '
                              'installed') from None
    with tempfile.TemporaryDirectory() as folder:
        model = modelcloud.get(filename[len('pavi://'):])
        path = os.path.join(folder, os.path.basename(model.name))
        model.download(path)
        return load_checkpoint_file(path, map_location=map_location, origin=filename,
                                    temporary=True)


#: every prefix mmengine registers, with its safe loader (patterns as mmengine writes them)
SCHEMES: Dict[str, Callable[..., Any]] = {
    'http://': load_from_http, 'https://': load_from_http,
    'modelzoo://': load_from_torchvision, 'torchvision://': load_from_torchvision,
    'open-mmlab://': load_from_openmmlab, 'openmmlab://': load_from_openmmlab,
    'mmcls://': load_from_mmcls, 'pavi://': load_from_pavi,
    r'(\S+\:)?s3://': load_from_ceph, r'(\S+\:)?petrel://': load_from_ceph,
}


def scheme_of(name: str) -> Optional[str]:
    """The prefix of :data:`SCHEMES` that ``name`` starts with (matched in mmengine's order:
    prefixes sorted in reverse, each a regular expression), or None for a local path."""
    for prefix in sorted(SCHEMES, reverse=True):
        if re.match(prefix, name) is not None:
            return prefix
    return None


def load_checkpoint(name: str, map_location: Any = 'cpu') -> Any:
    """A checkpoint by local path, URL or prefixed name, always through the allow-list loader
    (:func:`~amvim_mm.utils.safe_load.load_checkpoint_file`)."""
    prefix = scheme_of(name)
    if prefix is None:
        return load_checkpoint_file(os.path.expanduser(name), map_location=map_location)
    return SCHEMES[prefix](name, map_location)
