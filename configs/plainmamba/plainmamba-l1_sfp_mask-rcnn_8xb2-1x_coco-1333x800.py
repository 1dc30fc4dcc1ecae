# PlainMamba-L1 + simple feature pyramid + Mask R-CNN on COCO, 1x schedule, total batch 16
# (8 GPUs x 2). OUR SETTING, NOT THE OFFICIAL MODEL: the official PlainMamba detectors
# (official plain_mamba_det_configs/maskrcnn/l*_maskrcnn_1x.py) wrap the backbone in a
# ViT-Adapter (PlainMambaAdapter: spatial prior module + interaction blocks with multi-scale
# deformable attention, which needs the MSDeformAttn CUDA ops) feeding an FPN; that adapter is
# not implemented here. Instead the last layer's map (stride 16, C channels, through ln1) goes
# into the ViTDet simple feature pyramid of ../_base_/sfp_mask-rcnn.py (scales 4, 2, 1, 0.5 +
# a max-pooled level, 256 channels, LayerNorm) and mmdet's Mask R-CNN heads (as that base).
# The rest is the official PlainMamba detection recipe: single scale 1333 x 800 training and
# testing (flip), images without boxes kept, AdamW lr 1e-4 wd 0.05 with decay_mult 0 for names
# containing 'norm', 'bias', 'pos_embed', '.A_log', '.D', '.direction_Bs' (the official custom
# keys), no gradient clipping, 500 linear warm-up iterations from 0.001, 12 epochs with lr x 0.1
# after epochs 8 and 11; drop path 0.1 (L1) / 0.2 (L2) / 0.3 (L3).
# Published numbers (box / mask AP 44.1 / 39.1 L1, 46.0 / 40.6 L2, 46.8 / 41.2 L3) are for the
# official ViT-Adapter model, NOT for this config: none is published for this one.
# Initialised from the released ImageNet file (l1.pth), loaded strictly.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/datasets/coco_instance.py',
    'mmdet::_base_/schedules/schedule_1x.py',
    'mmdet::_base_/default_runtime.py',
]
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)

embed_dims = 192                      # C: 192 (L1), 384 (L2), 448 (L3)
model = dict(
    backbone=dict(
        _delete_=True,                            # no ResNet key reaches PlainMamba
        type='PlainMamba',
        arch='l1',
        img_size=224,                             # pos-embed grid 14 x 14, resized per input
        out_type='featmap',
        out_indices=(-1, ),                       # the last layer's map, through ln1
        final_norm=True,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='pretrain/l1.pth')),
    neck=dict(
        _delete_=True,
        type='SimpleFeaturePyramid', in_channels=embed_dims, out_channels=256,
        scales=(4, 2, 1, 0.5), norm_cfg=dict(type='LN2d'), num_outs=5))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={
        'norm': dict(decay_mult=0.),
        'bias': dict(decay_mult=0.),
        'pos_embed': dict(decay_mult=0.),
        '.A_log': dict(decay_mult=0.),
        '.D': dict(decay_mult=0.),
        '.direction_Bs': dict(decay_mult=0.),
    }))
# the 1x schedule of the base (12 epochs, 500 warm-up iterations from 0.001, steps 8 and 11)
# total batch 16 = 8 GPUs x 2 images; the official run keeps images without boxes
train_dataloader = dict(batch_size=2, dataset=dict(filter_cfg=dict(filter_empty_gt=False)))
auto_scale_lr = dict(enable=False, base_batch_size=16)
# the backbone's BatchNorms (conv stem, L1's dw block) become SyncBN when distributed, as the
# official convert_syncbn=True
sync_bn = 'torch'
# crash-safe saves (amvim_mm.engine.checkpoint_hook): new file, then last_checkpoint, then
# deletion of old ones; atomic writes
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook',
                                     backend_args=dict(backend='atomic_local')))
