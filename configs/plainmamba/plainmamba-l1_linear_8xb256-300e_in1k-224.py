# PlainMamba-L1 ImageNet-1k classifier: the PlainMamba backbone with out_type='avg_featmap'
# (ln1 after the last layer, then the mean over the tokens: the official CustomAveragePooling
# neck, C = 192 channels) and the official Linear(C, 1000) as LinearClsHead. Total batch 2048
# (8 GPUs x 256), 300 epochs, as the official plain_mamba_l1_in1k_300e.py.
# Evaluate the released file (mmcls layout: backbone.*, head.fc.*, which are this model's own
# key names; published Top-1 77.9 / Top-5 94.0, 7.3M params, 3.0G FLOPs):
#   python tools/test.py THIS_CONFIG pretrain/l1.pth
# Evaluation as the official one (mmcls 0.x imagenet_bs64_swin_224 pipeline): short side 256
# bicubic (pillow), center crop 224; mmpretrain's imagenet_bs64_swin_224.py test pipeline.
# Official training recipe (Swin's mmcls schedule with PlainMamba's settings): AdamW lr 2e-3
# (5e-4 x 256 x 8 / 512), weight decay 0.05, none for norms, biases, pos_embed, A_log, D,
# direction_Bs; gradient clipping at norm 5.0 (L1) / 1.0 (L2, L3); 15 (L1) / 20 (L2, L3) linear
# warm-up epochs from a factor 1e-3, cosine to 1e-2 x lr; RandomResizedCrop 224 bicubic,
# RandAugment m9-mstd0.5, RandomErasing 0.25, Mixup 0.8 / CutMix 1.0 (one of them per batch),
# label smoothing 0.1; drop path 0.2 (L1, L2) / 0.4 (L3). Not set here: mixed precision for L1
# (the official AmpEpochBasedRunner, fp16; tools/train.py --amp gives bf16) and the EMA of the
# weights of L2 / L3 (official EMACheckpointHook, momentum 1e-4).
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
]
custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)

embed_dims = 192                      # C: 192 (L1), 384 (L2), 448 (L3)
model = dict(
    type='ImageClassifier',
    backbone=dict(type='PlainMamba', arch='l1', img_size=224, out_indices=-1,
                  out_type='avg_featmap', final_norm=True, drop_path_rate=0.2),
    neck=None,
    head=dict(type='LinearClsHead', num_classes=1000, in_channels=embed_dims,
              loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
              init_cfg=dict(type='TruncNormal', layer='Linear', std=.02)),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]))

# total batch 2048 = 8 GPUs x 256
train_dataloader = dict(batch_size=256)
val_dataloader = dict(batch_size=256)
test_dataloader = val_dataloader
lr = 5e-4 * 256 * 8 / 512
optim_wrapper = dict(
    optimizer=dict(lr=lr),
    paramwise_cfg=dict(
        _delete_=True,                            # the base's Swin-only keys are dropped
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        custom_keys={
            '.pos_embed': dict(decay_mult=0.0),
            '.A_log': dict(decay_mult=0.0),
            '.D': dict(decay_mult=0.0),
            '.direction_Bs': dict(decay_mult=0.0),
        }),
    clip_grad=dict(max_norm=5.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=15, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=lr * 1e-2, by_epoch=True, begin=15, end=300,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=5)
auto_scale_lr = dict(enable=False, base_batch_size=2048)
# crash-safe saves (amvim_mm.engine.checkpoint_hook): new file, then last_checkpoint, then
# deletion of old ones; atomic writes
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook',
                                     backend_args=dict(backend='atomic_local')))
