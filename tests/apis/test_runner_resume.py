"""An mmseg Runner with the Vim backbone trains on CPU, checkpoints, resumes and tests.

Covers the torch >= 2.6 / mmengine 0.10.7 checkpoint trap (see ``amvim_mm.utils.compat``): an
mmengine training checkpoint pickles ``HistoryBuffer`` & co.; our loader reads them with
``weights_only=True`` and an allow-list of exactly those types, from any folder. This uses
mmengine's own ``CheckpointHook``, as the libraries' tools do with their configs.
"""
import uuid
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

from amvim_mm.utils import safe_load


pytestmark = [
    # LoadAnnotations(reduce_zero_label=True) is redundant with ADE20KDataset (mmseg warns)
    pytest.mark.filterwarnings('ignore:`reduce_zero_label` will be deprecated:UserWarning'),
    pytest.mark.filterwarnings('ignore:``build_loss`` would be deprecated:UserWarning'),
]


def _seg_cfg(data_root, work_dir, max_iters=2, with_val=True):
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', reduce_zero_label=True),
        dict(type='PackSegInputs')
    ]

    def dataset(split):
        return dict(
            type='ADE20KDataset',
            data_root=str(data_root),
            data_prefix=dict(img_path=f'images/{split}', seg_map_path=f'annotations/{split}'),
            pipeline=pipeline)

    def loader(split, batch_size, sampler):
        return dict(batch_size=batch_size, num_workers=0, persistent_workers=False,
                    sampler=dict(type=sampler, shuffle=split == 'training'),
                    dataset=dataset(split))

    cfg = dict(
        default_scope='mmseg',
        custom_imports=dict(imports=['amvim_mm'], allow_failed_imports=False),
        model=dict(
            type='EncoderDecoder',
            data_preprocessor=dict(
                type='SegDataPreProcessor',
                mean=[123.675, 116.28, 103.53],
                std=[58.395, 57.12, 57.375],
                bgr_to_rgb=True,
                pad_val=0,
                seg_pad_val=255,
                size=(64, 64)),
            backbone=dict(type='Vim', arch='test', img_size=64, out_type='featmap',
                          out_indices=(-1, ), with_cls_token=False),
            decode_head=dict(
                type='FCNHead',
                in_channels=32,
                channels=16,
                num_convs=1,
                concat_input=False,
                num_classes=150,
                in_index=0,
                dropout_ratio=0.1,
                norm_cfg=dict(type='BN', requires_grad=True),
                align_corners=False,
                loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0,
                                 avg_non_ignore=True)),
            train_cfg=dict(),
            test_cfg=dict(mode='whole')),
        train_dataloader=loader('training', 2, 'InfiniteSampler'),
        train_cfg=dict(type='IterBasedTrainLoop', max_iters=max_iters,
                       val_interval=2 if with_val else 10**6),
        optim_wrapper=dict(type='OptimWrapper',
                           optimizer=dict(type='SGD', lr=0.01, momentum=0.9,
                                          weight_decay=5e-4)),
        param_scheduler=[dict(type='PolyLR', eta_min=1e-4, power=0.9, begin=0, end=4,
                              by_epoch=False)],
        default_hooks=dict(
            timer=dict(type='IterTimerHook'),
            logger=dict(type='LoggerHook', interval=1, log_metric_by_epoch=False),
            param_scheduler=dict(type='ParamSchedulerHook'),
            checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=1),
            sampler_seed=dict(type='DistSamplerSeedHook')),
        env_cfg=dict(cudnn_benchmark=False, dist_cfg=dict(backend='gloo')),
        launcher='none',
        log_level='WARNING',
        randomness=dict(seed=0),
        work_dir=str(work_dir),
    )
    if with_val:
        cfg.update(
            val_dataloader=loader('validation', 1, 'DefaultSampler'),
            test_dataloader=loader('validation', 1, 'DefaultSampler'),
            val_evaluator=dict(type='IoUMetric', iou_metrics=['mIoU']),
            test_evaluator=dict(type='IoUMetric', iou_metrics=['mIoU']),
            val_cfg=dict(type='ValLoop'),
            test_cfg=dict(type='TestLoop'))
    return cfg


def _runner(cfg, cfg_dir, **overrides):
    """Build a Runner as tools/train.py does: through a config *file* (so custom_imports runs)."""
    cfg = dict(cfg, **overrides)
    # Unique names: mmengine keys its global logger / message hub / visualizer / scope instances
    # by experiment name, and two runners started in the same second would otherwise share them.
    cfg['experiment_name'] = f'amvim_test_{uuid.uuid4().hex[:8]}'
    path = Path(cfg_dir) / f'{cfg["experiment_name"]}.py'
    Config(cfg).dump(str(path))
    return Runner.from_cfg(Config.fromfile(str(path)))


class _Recorder(Hook):
    """Records the state at the start of training and the iterations run."""

    def __init__(self):
        self.start_iter = None
        self.start_state = None
        self.start_optim_state_len = None
        self.iters = []

    def before_train(self, runner):
        self.start_iter = runner.iter
        self.start_state = {k: v.detach().clone() for k, v in runner.model.state_dict().items()}
        self.start_optim_state_len = len(runner.optim_wrapper.optimizer.state)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.iters.append(batch_idx)
        if outputs and 'loss' in outputs:
            assert torch.isfinite(torch.as_tensor(outputs['loss'])).all()


@pytest.fixture
def isolated_trust(monkeypatch):
    """No opt-in for full unpickling from the environment."""
    for name in ('AMVIM_UNSAFE_LOAD', 'AMVIM_TRUSTED_DIRS', 'AMVIM_ALLOW_UNSAFE_LOAD'):
        monkeypatch.delenv(name, raising=False)


def test_train_checkpoint_resume_and_test(tmp_ade20k, tmp_path, isolated_trust):
    work_dir = tmp_path / 'work'
    cfg = _seg_cfg(tmp_ade20k, work_dir, max_iters=2)

    first = _runner(cfg, tmp_path)
    rec1 = _Recorder()
    first.register_hook(rec1)
    first.train()
    assert rec1.iters == [0, 1] and first.iter == 2
    ckpt = work_dir / 'iter_2.pth'
    assert ckpt.is_file() and (work_dir / 'iter_1.pth').is_file()
    assert Path((work_dir / 'last_checkpoint').read_text().strip()) == ckpt
    saved = torch.load(ckpt, map_location='cpu', weights_only=False)
    assert saved['meta']['iter'] == 2
    final_weights = {k: v.detach().clone() for k, v in first.model.state_dict().items()}

    second = _runner(cfg, tmp_path, resume=True,
                     train_cfg=dict(cfg['train_cfg'], max_iters=4))
    rec2 = _Recorder()
    second.register_hook(rec2)
    second.train()

    # resumed: counting goes on from iteration 2, with the saved weights and optimizer state
    assert rec2.start_iter == 2
    assert rec2.iters == [2, 3] and second.iter == 4
    assert rec2.start_state.keys() == saved['state_dict'].keys()
    for k, v in saved['state_dict'].items():
        torch.testing.assert_close(rec2.start_state[k], v, msg=k)
        torch.testing.assert_close(final_weights[k], v, msg=k)
    assert rec2.start_optim_state_len > 0  # SGD momentum buffers were restored
    assert (work_dir / 'iter_4.pth').is_file()
    # and the weights did change during the resumed iterations
    now = second.model.state_dict()
    assert any(not torch.equal(now[k], v) for k, v in saved['state_dict'].items()
               if v.is_floating_point())

    metrics = second.test()
    assert 'mIoU' in metrics and 0.0 <= metrics['mIoU'] <= 100.0


def test_resume_from_any_folder_loads_safely(tmp_ade20k, tmp_path, isolated_trust):
    """A training checkpoint outside ./work_dirs (no folder is trusted any more) resumes, read
    with weights_only=True: every type it pickles is on the allow-list."""
    work_dir = tmp_path / 'anywhere'
    cfg = _seg_cfg(tmp_ade20k, work_dir, max_iters=1, with_val=False)
    _runner(cfg, tmp_path).train()
    ckpt = work_dir / 'iter_1.pth'
    assert ckpt.is_file()
    assert Path('work_dirs').resolve() not in ckpt.resolve().parents
    # mmengine's own checkpoint needs more than torch's default allow-list ...
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(ckpt))
    # ... and nothing beyond ours
    with torch.serialization.safe_globals(safe_load.SAFE_GLOBALS):
        saved = torch.load(ckpt, map_location='cpu', weights_only=True)
    assert saved['meta']['iter'] == 1 and 'message_hub' in saved and 'optimizer' in saved

    again = _runner(cfg, tmp_path, resume=True, train_cfg=dict(cfg['train_cfg'], max_iters=2))
    rec = _Recorder()
    again.register_hook(rec)
    again.train()
    assert rec.start_iter == 1 and again.iter == 2
