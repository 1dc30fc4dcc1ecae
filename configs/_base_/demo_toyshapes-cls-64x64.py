# The classification demo: a small Vim-family classifier (mmpretrain ImageClassifier) on the
# classification version of the toy shapes (amvim_mm.datasets.make_toy_shapes_cls: one shape
# per image, its kind the label, ImageNet folder layout), trained on a CPU in minutes.
# Backbone as the other demos (D 64, 8 blocks, patch 8: an 8x8 grid, no class token) with the
# final norm, mmpretrain's GlobalAveragePooling neck and a linear head, 4 classes. (A middle
# class token from scratch did not learn here: 30 % top-1 after 600 iterations at lr 3e-3,
# chance 25 %, against 47 % with pooling.) AdamW lr 3e-3, wd 0.01, batch 8, 2000 iterations,
# 100 warm-up iterations then poly decay. Single process.
_base_ = ['mmpretrain::_base_/default_runtime.py', './demo_schedule_adamw-2k.py']
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)

embed_dims = 64
demo_arch = dict(embed_dims=embed_dims, num_layers=8, d_state=8)
data_preprocessor = dict(num_classes=4, mean=[123.675, 116.28, 103.53],
                         std=[58.395, 57.12, 57.375], to_rgb=True)
model = dict(
    type='ImageClassifier',
    backbone=dict(type='Vim', arch=demo_arch, img_size=64, patch_size=8, stride=8,
                  out_type='featmap', with_cls_token=False, final_norm=True,
                  drop_path_rate=0.0),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(type='LinearClsHead', num_classes=4, in_channels=embed_dims,
              loss=dict(type='CrossEntropyLoss', loss_weight=1.0)))

data_root = 'data/toy_shapes_cls'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(type='CustomDataset', data_root=data_root, data_prefix='train',
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='CustomDataset', data_root=data_root, data_prefix='val',
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_evaluator = val_evaluator

optim_wrapper = dict(optimizer=dict(lr=3e-3))
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    checkpoint=dict(type='AtomicCheckpointHook', by_epoch=False, interval=500, max_keep_ckpts=2,
                    save_last=True, backend_args=dict(backend='atomic_local')))
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)
