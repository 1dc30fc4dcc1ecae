"""``AtomicCheckpointHook`` removes the temporaries of its own killed writes and nothing else.

A leftover is made the way a crash makes one: a forked process runs the atomic writer and is
killed with SIGKILL between writing the temporary file and renaming it. The user's files in the
same folder (``.notes.tmp``, editors' swap files, files that merely look like ours) survive,
also through ``tools/train.py --work-dir``.
"""
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from mmengine.logging import MessageHub, MMLogger

from amvim_mm.engine.checkpoint_hook import AtomicCheckpointHook, checkpoint_names
from amvim_mm.engine.fileio import atomic_write_bytes, temporary_target
from amvim_mm.testing import make_ade20k
from tests.test_tools_e2e import NO_VAL, SEG_BASE, SEG_CONFIG, run_tool, write_config

#: files a user may keep in a work dir; none of them is a temporary of this hook
USER_FILES = ('.notes.tmp', '.x.pth.tmp', '.iter_1.pth.tmp',
              '.iter_1.pth.abcdefgh.tmp',                # the writer's old naming
              '.last_checkpoint.amvim-abcd1234.tmp.bak',
              '.iter_1.pth.amvim-abcdefghi.tmp',         # 9 random characters
              '.iter_1.pth.amvim-ABCDEFGH.tmp',          # not mkstemp's alphabet
              '.notes.txt.amvim-abcdefgh.tmp',           # our pattern, a target we never write
              'iter_1.pth.amvim-abcdefgh.tmp')           # no leading dot


def killed_write(target: Path) -> Path:
    """The temporary file that an atomic write of ``target`` leaves when the process is killed
    after writing it and before renaming it over the target."""
    before = set(os.listdir(target.parent))
    pid = os.fork()
    if pid == 0:   # the child dies inside the writer, as a SIGKILL during a save would
        try:
            os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)
            atomic_write_bytes(b'half a checkpoint', target)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    left = sorted(set(os.listdir(target.parent)) - before)
    assert len(left) == 1 and not target.exists(), left
    return target.parent / left[0]


def _user_files(folder: Path) -> dict:
    out = {}
    for name in USER_FILES:
        (folder / name).write_text(f'user data {name}')
        out[name] = f'user data {name}'
    (folder / '.iter_2.pth.amvim-abcdefgh.tmp').mkdir()   # a folder with our name: not a file
    return out


def _before_train(hook: AtomicCheckpointHook, work_dir: Path) -> None:
    runner = SimpleNamespace(work_dir=str(work_dir), logger=MMLogger.get_current_instance(),
                             message_hub=MessageHub.get_current_instance())
    hook.before_train(runner)


def test_writer_temporaries_are_named_unmistakably(tmp_path):
    left = killed_write(tmp_path / 'iter_3.pth')
    assert left.name.startswith('.iter_3.pth.amvim-') and left.name.endswith('.tmp')
    assert temporary_target(left.name) == 'iter_3.pth'
    assert left.read_bytes() == b'half a checkpoint'
    for name in USER_FILES:
        assert temporary_target(name) in (None, 'notes.txt'), name
    # a completed write leaves nothing but the target
    atomic_write_bytes(b'whole', tmp_path / 'done.bin')
    assert sorted(os.listdir(tmp_path)) == sorted([left.name, 'done.bin'])


def test_checkpoint_names_follow_the_template():
    names = checkpoint_names('iter_{}.pth')
    for ok in ('iter_3.pth', 'iter_120.pth', 'best_mIoU_iter_2.pth',
               'best_coco_bbox_mAP_iter_9.pth'):
        assert names.fullmatch(ok), ok
    for bad in ('iter_.pth', 'iter_3.pth.bak', 'notes.txt', 'epoch_3.pth', 'last_checkpoint'):
        assert not names.fullmatch(bad), bad
    assert checkpoint_names('ckpt_{:04d}.pth').fullmatch('ckpt_0003.pth')
    assert not checkpoint_names('ckpt_{:04d}.pth').fullmatch('ckpt_0003xpth')


def test_before_train_removes_only_its_own_leftovers(tmp_path):
    user = _user_files(tmp_path)
    ours = [killed_write(tmp_path / name)
            for name in ('iter_3.pth', 'last_checkpoint', 'best_mIoU_iter_2.pth')]
    # the same writer's leftover for a file this hook does not write
    foreign = killed_write(tmp_path / 'results.json')
    _before_train(AtomicCheckpointHook(interval=1, by_epoch=False), tmp_path)
    assert not [p for p in ours if p.exists()]
    assert foreign.exists()
    assert {n: (tmp_path / n).read_text() for n in user} == user
    assert (tmp_path / '.iter_2.pth.amvim-abcdefgh.tmp').is_dir()


def test_before_train_follows_its_template_and_folders(tmp_path):
    work_dir, out_root = tmp_path / 'work', tmp_path / 'out'
    out_dir = out_root / 'work'       # mmengine: out_dir / basename(work_dir)
    out_dir.mkdir(parents=True)
    work_dir.mkdir()
    mine = [killed_write(out_dir / 'ckpt_0003.pth'), killed_write(work_dir / 'last_checkpoint')]
    kept = [killed_write(out_dir / 'iter_3.pth'),            # another template's file
            killed_write(work_dir / 'ckpt_0003.pth'),        # checkpoints go to out_dir
            killed_write(out_dir / 'last_checkpoint')]       # the pointer lives in work_dir
    _before_train(AtomicCheckpointHook(interval=1, by_epoch=False, out_dir=str(out_root),
                                       filename_tmpl='ckpt_{:04d}.pth'), work_dir)
    assert [p.exists() for p in mine] == [False, False]
    assert [p.exists() for p in kept] == [True, True, True]


@pytest.mark.slow
def test_train_tool_keeps_the_users_tmp_files(tmp_path):
    """``tools/train.py --work-dir WD`` with the user's ``.notes.tmp`` in WD: the file
    survives a training, the hook's own leftover does not."""
    data_root = make_ade20k(tmp_path / 'ade', num_train=2, num_val=1, seed=0)
    cfg = write_config(tmp_path / 'vim-test_upernet_1xb2-1i_ade-64x64.py',
                       SEG_CONFIG.format(base=SEG_BASE, data_root=data_root))
    work = tmp_path / 'wd'
    work.mkdir()
    user = _user_files(work)
    stale = killed_write(work / 'iter_1.pth')
    _, out = run_tool(['train.py', cfg, '--work-dir', work, *NO_VAL, 'train_cfg.max_iters=1'],
                      cwd=tmp_path)
    assert 'removed 1 temporary files of interrupted checkpoint writes' in out, out[-3000:]
    assert not stale.exists() and (work / 'iter_1.pth').is_file()
    assert {n: (work / n).read_text() for n in user} == user
