# PlainMamba-L1 + UperNet, ADE20K 512x512, total batch 16 (8 GPUs x 2), 160k iterations.
# The official PlainMamba segmentation recipe (official plain_mamba_seg_configs/l1_upernet.py):
# no neck: the outputs of layers (5, 11, 17, 23) (L3: (8, 17, 26, 35)), four stride-16 maps
# with C channels (non-final ones through their own LayerNorm norm_layer{i}, the last through
# ln1), go straight into UPerHead (in channels [C] * 4, 512 channels, pool scales 1, 2, 3, 6,
# dropout 0.1, SyncBN); auxiliary FCNHead on map 3 (256 channels, loss weight 0.4); AdamW lr
# 6e-5, betas (0.9, 0.999), weight decay 0.01, decay_mult 0 for names containing 'norm',
# '.pos_embed', '.A_log', '.D', '.direction_Bs' (the official custom keys; ln1 keeps its decay,
# as in the official run, whose parameter names are the same); 1500 linear warm-up iterations
# from 1e-6, then poly decay (power 1.0) to 0; whole-image inference; drop path 0.1 (L1) /
# 0.2 (L2) / 0.3 (L3); final_norm True.
# img_size is left at 224 as in the official config (position embedding 14 x 14, resized
# bicubically to each input's grid in every forward, as the official PlainMambaSeg), so the
# released ImageNet file loads without resizing the parameter.
# Published (PlainMamba README): mIoU 44.1 (L1, 35M params) / 46.8 (L2, 55M) / 49.1 (L3, 81M).
# Initialised from the released ImageNet file (l1.pth, mmcls layout; backbone. stripped, head
# dropped), loaded strictly: a missing file is an error, never a silent random start.
_base_ = [
    'mmseg::_base_/models/upernet_vit-b16_ln_mln.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
]
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)

crop_size = (512, 512)
embed_dims = 192                      # C: 192 (L1), 384 (L2), 448 (L3)
# SyncBN across GPUs (the heads); mmengine reverts it to BN automatically on a single process
# (CPU, 1 GPU).
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(
        _delete_=True,                            # no ViT key reaches PlainMamba
        type='PlainMamba',
        arch='l1',
        img_size=224,
        out_type='featmap',
        out_indices=(5, 11, 17, 23),
        final_norm=True,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='pretrain/l1.pth')),
    neck=None,
    decode_head=dict(in_channels=[embed_dims] * 4, in_index=[0, 1, 2, 3], channels=512,
                     pool_scales=(1, 2, 3, 6), num_classes=150, norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=embed_dims, in_index=3, channels=256, num_classes=150,
                        norm_cfg=norm_cfg),
    test_cfg=dict(mode='whole'))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={
        'norm': dict(decay_mult=0.),
        '.pos_embed': dict(decay_mult=0.),
        '.A_log': dict(decay_mult=0.),
        '.D': dict(decay_mult=0.),
        '.direction_Bs': dict(decay_mult=0.),
    }))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]
# total batch 16 = 8 GPUs x 2 images
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
auto_scale_lr = dict(enable=False, base_batch_size=16)
# the backbone's BatchNorms (conv stem, L1's dw block) become SyncBN when distributed, as the
# official convert_syncbn=True
sync_bn = 'torch'
# crash-safe saves (amvim_mm.engine.checkpoint_hook): new file, then last_checkpoint, then
# deletion of old ones; atomic writes
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook',
                                     backend_args=dict(backend='atomic_local')))
