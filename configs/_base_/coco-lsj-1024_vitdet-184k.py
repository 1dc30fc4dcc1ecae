# ViTDet-style COCO recipe for a plain Vim-family backbone, with the values of the official Vim
# detection code's ViTDet-B base (hustvl/Vim det/ mask_rcnn_vimdet_b_100ep.py): simple feature
# pyramid (scales 4, 2, 1, 0.5 + max-pooled level, 256 channels, LayerNorm) from the last block,
# large-scale jitter 1024 (scale 0.1-2.0), AdamW lr 1e-4, weight decay 0.1 (none on 1-D
# parameters, pos_embed, cls_token, A_* and D: our default rule), layer-wise lr decay 0.7
# (ViTDet-B), total batch 64 (8 GPUs x 8), fp32, 184375 iterations (~100 epochs) with steps at
# 163889 and 177546 and 250 warm-up iterations, test images padded to a multiple of 32. The
# official Vim-T run differs (layer decay 0.837, 4 GPUs x 16, AMP, every parameter but pos_embed
# decayed, test images padded to a 1024 square):
# configs/vim/vim-t_sfp_cascade-mask-rcnn_4xb16-lsj-184k_coco-1024x1024_official-code.py.
# Data, schedule and runtime only: the model comes from ./sfp_mask-rcnn.py or
# ./sfp_cascade-mask-rcnn.py.
_base_ = [
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)

image_size = (1024, 1024)
embed_dims = 192
backend_args = None
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.1, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_type='absolute_range', crop_size=image_size,
         recompute_bbox=True, allow_negative_crop=True),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
# total batch 64 = 8 GPUs x 8
train_dataloader = dict(batch_size=8, num_workers=8,
                        sampler=dict(type='InfiniteSampler', shuffle=True),
                        dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.7))
max_iters = 184375
interval = 5000
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=interval)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=250),
    dict(type='MultiStepLR', begin=0, end=max_iters, by_epoch=False,
         milestones=[163889, 177546], gamma=0.1),
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    checkpoint=dict(type='AtomicCheckpointHook', by_epoch=False, save_last=True,
                    interval=interval, max_keep_ckpts=5,
                    backend_args=dict(backend='atomic_local')))
log_processor = dict(by_epoch=False)
auto_scale_lr = dict(enable=False, base_batch_size=64)
