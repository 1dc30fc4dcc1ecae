# VMamba-T (s1l8) ImageNet-1k classifier: the VMamba backbone with out_type='avg_featmap' (the
# official classifier's LayerNorm + global average pool, 8C = 768 channels) and the official
# Linear(8C, 1000) as LinearClsHead. Total batch 1024 (8 GPUs x 128), 300 epochs.
# Official training recipe (Swin's, with VMamba's drop path): AdamW lr 1e-3
# (5e-4 x 1024 / 512), weight decay 0.05 except 1-D parameters and biases, 20 linear warm-up
# epochs from 1e-6, cosine to 1e-5, gradient clipping at norm 5, RandomResizedCrop 224 bicubic,
# RandAugment m9-mstd0.5, RandomErasing 0.25, Mixup 0.8 / CutMix 1.0, label smoothing 0.1,
# drop path 0.2 (T) / 0.3 (S) / 0.6 (B). The official run also keeps an EMA of the weights
# (decay 0.9999) and trains in mixed precision (--amp here); neither is set in this file.
# Evaluation as the official one: short side 256 (= 224 / 0.875) bicubic, center crop 224.
# Published (VMamba): Top-1 82.6, 30M params, 4.9G FLOPs (S 83.6, B 83.9).
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
]
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)

num_features = 768                    # 8C; C = 96 (T, S), 128 (B)
model = dict(
    type='ImageClassifier',
    backbone=dict(type='VMamba', arch='tiny', out_indices=(3, ), out_type='avg_featmap',
                  drop_path_rate=0.2),
    neck=None,
    head=dict(type='LinearClsHead', num_classes=1000, in_channels=num_features,
              loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
              init_cfg=dict(type='TruncNormal', layer='Linear', std=.02)),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))

# total batch 1024 = 8 GPUs x 128
train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader
# AdamW lr 5e-4 x 1024 / 512 and weight decay 0.05 (the base's); no decay for norms, biases
# and every 1-D parameter (the official rule: len(shape) == 1 or the name ends with '.bias'; the
# base's Swin-only custom keys are dropped); gradient clipping at norm 5; 20 linear warm-up
# epochs from 1e-6 (factor 1e-3), then cosine to 1e-5 until epoch 300.
optim_wrapper = dict(
    paramwise_cfg=dict(_delete_=True, norm_decay_mult=0.0, bias_decay_mult=0.0,
                       flat_decay_mult=0.0),
    clip_grad=dict(max_norm=5.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=20, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=20, end=300),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
auto_scale_lr = dict(enable=False, base_batch_size=1024)
# crash-safe saves (amvim_mm.engine.checkpoint_hook): new file, then last_checkpoint, then
# deletion of old ones; atomic writes
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook',
                                     backend_args=dict(backend='atomic_local')))
