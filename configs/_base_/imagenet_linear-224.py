# ImageNet-1k classification with a Vim-family backbone, composed from mmpretrain's own bases.
# Data: mmpretrain's Swin/DeiT-style pipeline (RandomResizedCrop 224 bicubic, RandAugment
# m9-mstd0.5, RandomErasing 0.25; test: short edge 256 bicubic + center crop 224), which is the
# DeiT recipe the Vim models were trained with. Mixup 0.8 / CutMix 1.0 and label smoothing 0.1
# as in DeiT/Vim. Evaluation of the official checkpoints: tools/test.py CONFIG vim_*.pth.
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
]
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)

embed_dims = 192
model = dict(
    type='ImageClassifier',
    backbone=dict(type='Vim', arch='tiny', img_size=224, out_type='cls_token',
                  drop_path_rate=0.0),
    neck=None,
    head=dict(type='LinearClsHead', num_classes=1000, in_channels=embed_dims,
              loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
              init_cfg=dict(type='TruncNormal', layer='Linear', std=.02)),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))

# total batch 1024 = 8 GPUs x 128
train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=5e-4 * 1024 / 512, weight_decay=0.05, eps=1e-8,
                   betas=(0.9, 0.999)),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=1.0))
# DeiT/Vim schedule: 5 linear warm-up epochs, cosine to 1e-5, 300 epochs
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=5, end=300),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
# crash-safe saves (amvim_mm.engine.checkpoint_hook): new file, then last_checkpoint, then
# deletion of old ones; atomic writes
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook',
                                     backend_args=dict(backend='atomic_local')))
