"""A checkpoint hook whose saves survive being killed at any moment.

mmengine 0.10.7's ``CheckpointHook`` (with ``max_keep_ckpts``) deletes the oldest checkpoint
*before* writing the new one and rewrites ``last_checkpoint`` in place, so a run killed during a
save can be left with ``last_checkpoint`` naming a deleted file, or with no checkpoint at all.
:class:`AtomicCheckpointHook` keeps mmengine's options and file names and changes the order:

1. write the new checkpoint (to a temporary file, renamed over the target: with the
   ``atomic_local`` backend, :mod:`amvim_mm.engine.fileio`, which this hook selects for local
   folders);
2. point ``last_checkpoint`` at it (again a temporary file and a rename);
3. only then delete the checkpoints beyond ``max_keep_ckpts``.

At every moment ``last_checkpoint`` names a complete file. When training starts, the temporary
files that a killed write of this hook left behind are removed: only names of the atomic writer's
exact pattern (``.<target>.amvim-<random>.tmp``, :mod:`amvim_mm.engine.fileio`) whose target is
a file this hook writes (``filename_tmpl`` checkpoints and the ``best_<key>_...`` ones in the
output folder, ``last_checkpoint`` in the work dir); any other file, a user's ``.notes.tmp``
included, is left alone.

It also records the SHA-256 of the weights in the checkpoint's ``meta`` (verified when the file
is loaded, see :mod:`amvim_mm.utils.safe_load`). Our configs and tools use it in place of
``CheckpointHook``.
"""
from __future__ import annotations

import glob
import os.path as osp
import re
import string
from typing import Callable, Optional

from mmengine.dist import is_main_process
from mmengine.hooks import CheckpointHook

from amvim_mm.registry import HOOKS
from amvim_mm.utils.safe_load import mark_weights
from .fileio import atomic_write_bytes, remove_stale_temporaries

#: the work dir's pointer to the newest checkpoint (mmengine's name)
POINTER = 'last_checkpoint'


def checkpoint_names(filename_tmpl: str) -> re.Pattern:
    """The file names a ``CheckpointHook`` with this ``filename_tmpl`` saves in its output
    folder: ``filename_tmpl.format(step)`` for any step, and the best checkpoints
    ``best_<key>_<that name>`` (mmengine replaces a ``/`` of the key with ``_``)."""
    body = ''.join(re.escape(literal) + ('' if field is None else r'\d+')
                   for literal, field, _, _ in string.Formatter().parse(filename_tmpl))
    return re.compile(r'(?:best_[^/]+_)?' + body)


def latest_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint ``--resume`` continues: the one ``last_checkpoint`` names if it exists,
    else the newest complete ``iter_*.pth`` / ``epoch_*.pth`` of the folder (a run that
    mmengine's own hook left with a dangling pointer), else ``None``."""
    pointer = osp.join(work_dir, POINTER)
    if osp.isfile(pointer):
        with open(pointer) as f:
            named = f.read().strip()
        if named and osp.isfile(named):
            return named
    found = []
    for path in glob.glob(osp.join(work_dir, '*_*.pth')):
        stem = osp.splitext(osp.basename(path))[0]
        kind, _, num = stem.partition('_')
        if kind in ('iter', 'epoch') and num.isdigit():
            found.append((kind == 'iter', int(num), path))
    return max(found)[2] if found else None


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """``CheckpointHook`` with crash-safe saves (see the module docstring); same arguments."""

    def __init__(self, *args, backend_args: Optional[dict] = None, **kwargs) -> None:
        out_dir = kwargs.get('out_dir')
        local = out_dir is None or '://' not in str(out_dir)
        if backend_args is None and local:
            backend_args = dict(backend='atomic_local')
        super().__init__(*args, backend_args=backend_args, **kwargs)

    def before_train(self, runner) -> None:
        super().before_train(runner)
        if not is_main_process():
            return
        work_dir, out_dir = osp.abspath(runner.work_dir), osp.abspath(str(self.out_dir))
        names = checkpoint_names(self.filename_tmpl)

        def written_by_us(folder: str) -> Callable[[str], bool]:
            return lambda target: ((folder == work_dir and target == POINTER)
                                   or (folder == out_dir and names.fullmatch(target) is not None))

        for folder in {work_dir, out_dir}:
            if osp.isdir(folder):
                n = remove_stale_temporaries(folder, written_by_us(folder))
                if n:
                    runner.logger.info(f'removed {n} temporary files of interrupted '
                                       f'checkpoint writes in {folder}')

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        mark_weights(checkpoint.setdefault('meta', {}), checkpoint['state_dict'])

    def _save_checkpoint_with_step(self, runner, step, meta):
        old = []
        if self.max_keep_ckpts > 0 and not (self.keep_ckpt_ids and
                                            self.keep_ckpt_ids[-1] == step):
            while len(self.keep_ckpt_ids) >= self.max_keep_ckpts:
                old.append(self.keep_ckpt_ids.popleft())
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))

        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, ckpt_filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(
            self.out_dir, ckpt_filename, self.file_client_args,
            save_optimizer=self.save_optimizer, save_param_scheduler=self.save_param_scheduler,
            meta=meta, by_epoch=self.by_epoch, backend_args=self.backend_args, **self.args)
        if not is_main_process():
            return
        atomic_write_bytes(str(self.last_ckpt).encode(),
                           osp.join(runner.work_dir, POINTER))
        for old_step in old:
            path = self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(old_step))
            if path == self.last_ckpt:
                continue
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)
            elif self.file_backend.isdir(path):   # deepspeed saves folders
                self.file_backend.rmtree(path)
