# VMamba-T (s1l8) + FPN + Mask R-CNN on COCO, 1x schedule, total batch 16 (8 GPUs x 2).
# The official VMamba detection recipe (mmdet's Swin-T Mask R-CNN 1x config with the VMamba
# backbone): FPN on the four stage outputs (C, 2C, 4C, 8C at strides 4-32), single-scale
# 1333 x 800 training and testing, AdamW lr 1e-4, betas (0.9, 0.999), weight decay 0.05,
# decay_mult 0 for parameters named '*norm*', 1000 linear warm-up iterations from 0.001, 12
# epochs with lr x 0.1 after epochs 8 and 11; drop path 0.2 (T) / 0.3 (S) / 0.6 (B), the
# official det configs' values.
# Published (VMamba, Mask R-CNN 1x, box AP / mask AP): T 47.3 / 42.7 (50M params, 271G FLOPs
# at 1280 x 800), S 48.7 / 43.7, B 49.2 / 44.1.
# Initialised from the official ImageNet file, loaded strictly: a missing file is an error,
# never a silent random start.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)

stage_dims = [96, 192, 384, 768]      # C, 2C, 4C, 8C; C = 96 (T, S), 128 (B)
model = dict(
    backbone=dict(
        _delete_=True,                            # no ResNet/Swin key reaches VMamba
        type='VMamba',
        arch='tiny',                              # s1l8: depths (2, 2, 8, 2), ssm_ratio 1.0
        out_indices=(0, 1, 2, 3),
        out_type='featmap',
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained',
                      checkpoint='pretrain/vssm1_tiny_0230s_ckpt_epoch_264.pth')),
    neck=dict(in_channels=stage_dims))

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[8, 11],
         gamma=0.1),
]
# No weight decay for parameters whose name contains 'norm' (the official custom key, from
# mmdet's Swin config): the blocks' norm / norm2, SS2D's out_norm, the output norms outnorm{i}.
# The LayerNorms named by index (patch_embed.2 / .7, layers.{i}.downsample.3) keep their decay,
# as in the official run (same parameter names).
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                   weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))
# total batch 16 = 8 GPUs x 2 images
train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)
# crash-safe saves (amvim_mm.engine.checkpoint_hook): new file, then last_checkpoint, then
# deletion of old ones; atomic writes
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook',
                                     backend_args=dict(backend='atomic_local')))
