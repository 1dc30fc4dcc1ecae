# The demo: a small Vim-family model + PlainPyramidNeck + UperNet on the built-in toy shapes
# (amvim_mm.datasets.toy_shapes, ADE20K folder layout, 64x64), trained on a CPU in minutes.
# Same code as the real configs, smaller arch: D 64, 8 blocks, patch 8 (an 8x8 token grid),
# features from blocks (1, 3, 5, 7). AdamW lr 1e-3, wd 0.01, batch 8, 2000 iterations,
# 100 warm-up iterations then poly decay. Single process (BN, not SyncBN).
_base_ = [
    'mmseg::_base_/models/upernet_vit-b16_ln_mln.py',
    'mmseg::_base_/default_runtime.py',
    './demo_schedule_adamw-2k.py',
]
custom_imports = dict(imports=['amvim_mm', 'amvim_mm.datasets'], allow_failed_imports=False)

crop_size = (64, 64)
embed_dims = 64
norm_cfg = dict(type='BN', requires_grad=True)
demo_arch = dict(embed_dims=embed_dims, num_layers=8, d_state=8)
model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(
        _delete_=True, type='Vim', arch=demo_arch, img_size=64, patch_size=8, stride=8,
        out_type='featmap', out_indices=(1, 3, 5, 7), with_cls_token=False, final_norm=False,
        drop_path_rate=0.0),
    neck=dict(_delete_=True, type='PlainPyramidNeck', in_channels=embed_dims,
              scales=(4, 2, 1, 0.5), norm_cfg=norm_cfg),
    decode_head=dict(in_channels=[embed_dims] * 4, channels=64, num_classes=5,
                     pool_scales=(1, 2, 4), dropout_ratio=0.0, norm_cfg=norm_cfg),
    auxiliary_head=None,
    test_cfg=dict(mode='whole'))

data_root = 'data/toy_shapes'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=8, num_workers=0,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(type='ToyShapesDataset', data_root=data_root,
                 data_prefix=dict(img_path='images/training',
                                  seg_map_path='annotations/training'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8, num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='ToyShapesDataset', data_root=data_root,
                 data_prefix=dict(img_path='images/validation',
                                  seg_map_path='annotations/validation'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    checkpoint=dict(type='AtomicCheckpointHook', by_epoch=False, interval=500, max_keep_ckpts=2,
                    save_last=True, backend_args=dict(backend='atomic_local')),
    visualization=dict(type='SegVisualizationHook', draw=False))
randomness = dict(seed=0)
