# VMamba-T (s1l8) + UperNet, ADE20K 512x512, total batch 16 (4 GPUs x 4), 160k iterations.
# The official VMamba segmentation recipe (mmseg's Swin UperNet 160k config with the VMamba
# backbone): UPerHead on the four stage outputs (C, 2C, 4C, 8C at strides 4-32), 512 channels;
# auxiliary FCNHead on stage 2 (256 channels, loss weight 0.4); AdamW lr 6e-5, betas
# (0.9, 0.999), weight decay 0.01, decay_mult 0 for parameters named '*norm*'; 1500 linear
# warm-up iterations from 1e-6, then poly decay (power 1.0) to 0; whole-image inference; drop
# path 0.2 (T) / 0.3 (S) / 0.6 (B), the official seg configs' values.
# Published (VMamba, mIoU single / multi scale): T 47.9 / 48.8 (62M params, 949G FLOPs at
# 512 x 2048), S 50.6 / 51.2, B 51.0 / 51.6. Multi scale: mmseg's SegTTAModel with the
# tta_pipeline of the ade20k base (the official --tta).
# Initialised from the official ImageNet file, loaded strictly: a missing file is an error,
# never a silent random start.
_base_ = [
    'mmseg::_base_/models/upernet_swin.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
]
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)

crop_size = (512, 512)
stage_dims = [96, 192, 384, 768]      # C, 2C, 4C, 8C; C = 96 (T, S), 128 (B)
# SyncBN across GPUs (the heads); mmengine reverts it to BN automatically on a single process
# (CPU, 1 GPU).
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(
        _delete_=True,                            # no Swin key reaches VMamba
        type='VMamba',
        arch='tiny',                              # s1l8: depths (2, 2, 8, 2), ssm_ratio 1.0
        out_indices=(0, 1, 2, 3),
        out_type='featmap',
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained',
                      checkpoint='pretrain/vssm1_tiny_0230s_ckpt_epoch_264.pth')),
    decode_head=dict(in_channels=stage_dims, channels=512,
                     num_classes=150, norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=stage_dims[2], in_index=2, channels=256,
                        num_classes=150, norm_cfg=norm_cfg),
    test_cfg=dict(mode='whole'))

# No weight decay for parameters whose name contains 'norm' (the official custom key, from
# mmseg's Swin config): the blocks' norm / norm2, SS2D's out_norm, the output norms outnorm{i}.
# The LayerNorms named by index (patch_embed.2 / .7, layers.{i}.downsample.3) keep their decay,
# as in the official run (same parameter names).
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]
# total batch 16 = 4 GPUs x 4 images (the official file name; 8 GPUs x 2 gives the same total)
train_dataloader = dict(batch_size=4)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
auto_scale_lr = dict(enable=False, base_batch_size=16)
# crash-safe saves (amvim_mm.engine.checkpoint_hook): new file, then last_checkpoint, then
# deletion of old ones; atomic writes
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook',
                                     backend_args=dict(backend='atomic_local')))
