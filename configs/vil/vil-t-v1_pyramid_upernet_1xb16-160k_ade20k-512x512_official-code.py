# Recipe: official code (ViL): NX-AI/vision-lstm src/vislstm/yamls/segmentation/
# vil_t16_upernet160k_dim192.yaml at 381ba95. Published: 41.2 mIoU single scale (43.1 multi-scale)
# for ViL-T v1 under this recipe (ViL paper). Starts from the released v1 file
# vil_tiny16_e800_in1k.th (torch hub 'vil-tiny', 77.3 % top-1; the yaml starts from that e800
# run, its _e400 twin from vil_tiny16_e400_in1k.th).
#
# ViL-T v1 (24 blocks, alternating directions) + the BEiT pyramid (PlainPyramidNeck) + UperNet,
# ADE20K 512x512, total batch 16 on ONE GPU (the official UperNetModel asserts a world size of 1),
# 160k iterations, fp16. Point by point as the official code runs it:
#   * taps: the raw outputs (residual stream, no norm) of blocks 7, 11, 15, 23 (block_extractor
#     hooks on blocks[i]); drop path 0.0 (drop_path_decay on, so nothing is dropped);
#   * pyramid: ConvT-BN-GELU-ConvT / ConvT / Identity / MaxPool(2) with BatchNorm2d (one GPU:
#     SyncBN here is BN); its init is PyTorch's default: the official postprocessor calls
#     kappamodules' init_xavier_uniform_zero_bias(self) on the container module, which only
#     acts on a Linear/Conv instance, so it is a no-op; our neck keeps the default init too (no
#     init_cfg, on purpose);
#   * UperNet decoder and auxiliary FCN head with 192 channels, no dropout; auxiliary head on
#     feature 2 (the x1 map), loss weight 0.4;
#   * AdamW (0.9, 0.999), lr 5e-4 x batch / 16 (= 5e-4 at 16), wd 0.05; no weight decay for 1-D
#     parameters (biases, norm weights, learnable_skip, gate biases: exclude_bias_from_wd /
#     exclude_norm_from_wd) and the learnable position embedding (pos_embed.embed); everything
#     else, convs included, decayed;
#   * layer decay 0.65 over block PAIRS (layerwise_lr_decay with group_two_blocks): pair k =
#     blocks 2k and 2k+1 gets 0.65 ** (12 - k), patch and position embeddings 0.65 ** 13, the
#     neck and heads (own optimisers) 1.0; ViL's layer_depth_per_pair (default) gives exactly
#     these depths to LayerDecayOptimWrapperConstructor;
#   * linear warm-up 1500 iterations, then cosine to 1e-6 (per group, times its layer scale:
#     the official schedule value is multiplied by each group's lr_scale);
#   * data: resize (2048, 512) x 0.5-2.0 bicubic, random crop 512 (category ratio 0.75), flip,
#     colour jitter 0.5 / 0.5 / 0.5 / 0.25 instead of PhotoMetricDistortion (torchvision's
#     ColorJitter itself, as the official: amvim_mm.datasets' TorchvisionColorJitter; mmpretrain's
#     ColorJitter crashes on negative hue shifts with NumPy 2, see that module), pad to 512;
#   * evaluation every 10k iterations, best checkpoint on val mIoU kept; the official
#     "slide 341" evaluation first resizes every image to 512 x 512 (F.interpolate(x,
#     size=512), aspect ratio NOT kept), so the slide is one 512 window, and the prediction is
#     resized back bilinearly: the test pipeline below does the same.
# Not matched (mmseg has no knob for them): the official pads crops centred (mmseg: bottom /
# right); it resizes the normalised tensor for evaluation (mmseg: the uint8 image, bicubic);
# its heads' convs are initialised normal(0.02) (mmseg: kaiming for ConvModules, normal(0.01)
# for conv_seg); its warm-up starts at 0 (here lr x 1e-6: mmengine's LinearLR needs a factor
# > 0); it skips steps with a NaN loss (here AMP's dynamic loss scale skips inf/NaN gradients);
# whether 41.2 is the best or the last evaluation is not stated.
# A different total batch: scale the lr by batch / 16 by hand (the official linear_lr_scaler),
# e.g. 8 GPUs x 2 = 16 keeps 5e-4 (but the official code never ran on several GPUs).
_base_ = ['../_base_/upernet_ade20k-512x512.py']
# amvim_mm.datasets registers TorchvisionColorJitter
custom_imports = dict(imports=['amvim_mm', 'amvim_mm.datasets'], allow_failed_imports=False)

crop_size = (512, 512)
embed_dims = 192
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    backbone=dict(
        _delete_=True,
        type='ViL',
        arch='tiny-v1',
        img_size=512,
        out_type='featmap',
        out_indices=(7, 11, 15, 23),
        tap='stream',
        drop_path_rate=0.0,
        drop_path_decay=True,
        layer_depth_per_pair=True,
        init_cfg=dict(type='Pretrained', checkpoint='pretrain/vil_tiny16_e800_in1k.th')),
    neck=dict(_delete_=True, type='PlainPyramidNeck', in_channels=embed_dims,
              scales=(4, 2, 1, 0.5), norm_cfg=norm_cfg),
    decode_head=dict(in_channels=[embed_dims] * 4, in_index=[0, 1, 2, 3], channels=embed_dims,
                     pool_scales=(1, 2, 3, 6), dropout_ratio=0.0, num_classes=150,
                     norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=embed_dims, in_index=2, channels=embed_dims, num_convs=1,
                        concat_input=False, dropout_ratio=0.0, num_classes=150,
                        norm_cfg=norm_cfg,
                        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False,
                                         loss_weight=0.4)),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(341, 341)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True,
         interpolation='bicubic'),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='TorchvisionColorJitter', brightness=0.5, contrast=0.5, saturation=0.5,
         hue=0.25),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=crop_size, keep_ratio=False, interpolation='bicubic'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
# total batch 16 = 1 GPU x 16 images
train_dataloader = dict(batch_size=16, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(batch_size=1, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

lr = 5e-4 * 16 / 16      # official: 5e-4 x (total batch / 16)
max_iters = 160000
warmup_iters = 1500
optim_wrapper = dict(
    _delete_=True,
    type='AmpOptimWrapper',
    dtype='float16',
    loss_scale='dynamic',
    optimizer=dict(type='AdamW', lr=lr, betas=(0.9, 0.999), weight_decay=0.05),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.65, flat_decay_mult=0.0, no_decay_leaves=(),
                       no_decay_names=('pos_embed.embed', )))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='CosineAnnealingLR', T_max=max_iters - warmup_iters, eta_min_ratio=1e-6 / lr,
         by_epoch=False, begin=warmup_iters, end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=10000)
# the lr above is already the one for this total batch (the official linear scaling by
# batch / 16): no automatic scaling on top
auto_scale_lr = dict(enable=False, base_batch_size=16)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', by_epoch=False,
                                     interval=10000, save_best='mIoU', rule='greater',
                                     backend_args=dict(backend='atomic_local')))
