# Recipe: official code (hustvl/Vim det/: cascade_mask_rcnn_vimdet_t_100ep_adj1.py +
# ft_vim_tiny_vimdet.sh), the config to use for reproduction of the Vim-T detection run.
# Vim-T + simple feature pyramid + Cascade Mask R-CNN on COCO, LSJ 1024 (scale 0.1-2.0),
# 184375 iterations (250 warm-up from 0.001, x0.1 at 163889 and 177546), total batch 64 (4 GPUs
# x 16), fp16 AMP (AmpOptimWrapper with a dynamic loss scale = train.amp.enabled=True);
# ../_base_/sfp_cascade-mask-rcnn.py with the heads, optimizer and test padding below.
# Heads as the official model (det/configs/common/models/mask_rcnn_vimdet.py +
# cascade_mask_rcnn_vimdet_b_100ep.py), built from mmdet's own modules: RPNHead with 2 convs;
# 3 cascade stages of Shared4Conv1FCBBoxHead (4 convs of 256 with LayerNorm (LN2d) after each,
# 1 fc of 1024), class-agnostic regression, target stds = 1 / detectron2's Box2BoxTransform
# weights (10, 5), (20, 10), (30, 15) (mmdet's default third stage rounds 1/30, 1/15 to 0.033,
# 0.067: set exactly here), proposal IoU thresholds 0.5 / 0.6 / 0.7; FCNMaskHead with 4 convs +
# LN2d. Also detectron2's defaults of those modules: L1 box losses (smooth_l1_beta=0) in the RPN
# and the three stages, 1000 RPN proposals per image in training, no anchor boundary filter.
# Optimizer: AdamW lr 1e-4, betas (0.9, 0.999), weight decay 0.1; layer decay 0.837 (adj1:
# get_vim_lr_decay_rate(num_layers=24, lr_decay_rate=0.837): patch and position embedding
# 0.837^25, block i 0.837^(24-i), everything else 1, which is our get_layer_depth convention).
# Weight decay on every parameter but pos_embed (flat_decay_mult=1.0, no_decay_leaves=
# ('pos_embed',)): detectron2's get_default_optimizer_params(weight_decay_norm=0.0) exempts only
# modules of the torch.nn norm classes, and the official model has none (its "LN" is
# detectron2's own LayerNorm class, detectron2/layers/batch_norm.py get_norm, and the blocks'
# RMSNorm is mamba_ssm's nn.Module), so biases, norm weights, D and A_log are decayed; only
# overrides={'pos_embed': weight decay 0}.
# Test: shortest side 1024 with the longer side at most 1024, then padded with zeros after
# normalisation to a 1024 x 1024 square (detectron2 square_pad=1024): pad_size_divisor=1024 of
# the data preprocessor (the longer side is always 1024 after the resize; training images are at
# most 1024 after the crop, so they pad to the same square; BatchFixedSizePad kept).
# Backbone: the last block's residual stream, hidden + residual (tap='stream'; the official
# last_layer_process='add'), no class token, no final norm, drop path 0.1.
# Deviations (what this config cannot match):
# - Backbone: the official one turns RoPE on (also on the residual) and the `/2` merge of the
#   two directions off, matching the unreleased v1-style weights it started from; our Vim has no
#   RoPE, and the released vim_t_midclstok_76p1acc.pth was trained with `/2` and without RoPE,
#   so both stay as that file was trained.
# - DDP fp16 gradient compression (train.ddp.fp16_compression=True, a DDP communication hook)
#   has no mmengine config equivalent: gradients are all-reduced in fp32.
# - mmdet's CascadeRoIHead: stage losses weighted 1 / 0.5 / 0.25, 512 RoIs resampled per stage
#   with the ground truth added, one mask head per stage (masks averaged at test); detectron2's
#   weights every stage 1 and scales the gradient into the RoI features by 1/3, keeps all
#   proposals of the previous stage, and has one mask head. Head initialisation is mmdet's.
# Published: 45.7 box AP / 39.2 mask AP (Vim paper, Table 3) came from this recipe but with the
# unreleased v1-style weights and RoPE: not an expected number for this config with the
# released file. Initialised from the released ImageNet weights (vim_t_midclstok_76p1acc.pth).
_base_ = ['../_base_/sfp_cascade-mask-rcnn.py']

head_norm = dict(type='LN2d')
# detectron2 Box2BoxTransform weights (w_xy, w_wh) of the three stages; mmdet's std = 1 / weight
box_weights = [(10, 5), (20, 10), (30, 15)]
model = dict(
    data_preprocessor=dict(pad_size_divisor=1024, pad_mask=True),
    backbone=dict(
        type='Vim', arch='tiny', img_size=1024, out_type='featmap', out_indices=(23, ),
        tap='stream', with_cls_token=False, final_norm=False, drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='pretrain/vim_t_midclstok_76p1acc.pth')),
    rpn_head=dict(
        num_convs=2,
        loss_bbox=dict(_delete_=True, type='L1Loss', loss_weight=1.0)),
    roi_head=dict(
        bbox_head=[
            dict(type='Shared4Conv1FCBBoxHead', in_channels=256, conv_out_channels=256,
                 fc_out_channels=1024, roi_feat_size=7, num_classes=80, norm_cfg=head_norm,
                 bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.],
                                 target_stds=[1 / w_xy, 1 / w_xy, 1 / w_wh, 1 / w_wh]),
                 reg_class_agnostic=True,
                 loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
                 loss_bbox=dict(type='L1Loss', loss_weight=1.0))
            for w_xy, w_wh in box_weights
        ],
        mask_head=dict(type='FCNMaskHead', num_convs=4, conv_out_channels=256,
                       norm_cfg=head_norm)),
    train_cfg=dict(
        rpn=dict(allowed_border=-1),
        rpn_proposal=dict(nms_pre=2000, max_per_img=1000)))

# total batch 64 = 4 GPUs x 16 (ft_vim_tiny_vimdet.sh --num-gpus 4, total_batch_size 64)
train_dataloader = dict(batch_size=16)
optim_wrapper = dict(
    type='AmpOptimWrapper', dtype='float16', loss_scale='dynamic',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.837, flat_decay_mult=1.0,
                       no_decay_leaves=('pos_embed', )))
