# Recipe: official code (LocalMamba): hunto/LocalMamba segmentation/configs/local_mamba/
# upernet_local_vim-tiny_8xb2-160k_ade20k-512x512.py at 75e5d1f (on mmseg's
# vit/vit_vit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py). Published: LocalVim-T UperNet 43.4
# mIoU single scale / 44.4 multi-scale (LocalMamba paper, Table 4), from LocalMamba's RoPE model
# (local_vim_tiny.ckpt): NOT an expected result of this config (below, and ./README.md).
# Starts from the released middle-class-token LocalVim-T file
# local_vim_tiny_middle_cls_token.ckpt (77.8 % top-1: the variant amvim_mm's LocalVim is).
#
# LocalVim-T (20 layers, the released direction table) + UperNet, ADE20K 512x512, total batch 16
# (8 GPUs x 2), 160k iterations, fp32. Point by point as the official code runs it:
#   * taps: the mixer output hidden_states of layers 4, 9, 14, 19 (no residual: tap='mixer'),
#     no class token, no norm_f, drop path 0.1 ([0] + linspace(0, 0.1, 20), as ours);
#   * no pyramid: the four stride-16 maps go to UperNet directly (official neck=None), each
#     through its own LayerNorm over the channels (the backbone's outnorm_0..3, nn.LayerNorm(D),
#     eps 1e-5). Here PlainPyramidNeck with scales (1, 1, 1, 1) (four identities) and
#     in_norm_cfg=LN2d (eps 1e-5): the same four normalised maps, kept so that the config has
#     the plain family's layout (one-line backbone swap, file name);
#   * UPerHead as mmseg's ViT base: channels 512, pools (1, 2, 3, 6), dropout 0.1, SyncBN;
#     auxiliary FCNHead on input 3 (the layer-19 map; every map is x1 here), 256 channels, one
#     conv, dropout 0.1, loss weight 0.4;
#   * AdamW lr 6e-5, (0.9, 0.999), weight decay 0.01, no layer decay; mmengine's own constructor
#     with the official custom_keys: no weight decay for names containing 'pos_embed',
#     'cls_token' or 'norm'; biases, A_log_k and D_k are decayed;
#   * linear warm-up 1500 iterations from 1e-6, then poly power 1.0 to 0 at 160k;
#   * mmseg's ADE20K data (PhotoMetricDistortion; test: shorter side 512) and WHOLE-image test
#     (the ViT base's test_cfg; the LocalMamba config does not change it); validation and a
#     checkpoint every 16k iterations, the last one evaluated.
# Not matched (amvim_mm's LocalVim is LocalMamba's middle-class-token variant): no RoPE (the
# official segmentation backbone applies RoPE to hidden states and residual in every layer);
# the official builds the blocks with rms_norm=False, i.e. LayerNorm carrying the RMSNorm
# weights of the file (zero bias), ours keeps RMSNorm; the weights are the
# middle-class-token file (no RoPE, 77.8 %) instead of local_vim_tiny.ckpt (RoPE, 76.2 %), which
# our LocalVim could load only without its RoPE (rope.* buffers are skipped), i.e. as a model
# other than the one trained.
_base_ = ['../_base_/upernet_ade20k-512x512.py']

crop_size = (512, 512)
embed_dims = 192
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    backbone=dict(
        _delete_=True,
        type='LocalVim',
        arch='tiny',
        img_size=512,
        out_type='featmap',
        out_indices=(4, 9, 14, 19),
        tap='mixer',
        with_cls_token=False,
        final_norm=False,
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained',
                      checkpoint='pretrain/local_vim_tiny_middle_cls_token.ckpt')),
    neck=dict(_delete_=True, type='PlainPyramidNeck', in_channels=embed_dims,
              scales=(1, 1, 1, 1), norm_cfg=norm_cfg, in_norm_cfg=dict(type='LN2d', eps=1e-5)),
    decode_head=dict(in_channels=[embed_dims] * 4, in_index=[0, 1, 2, 3], channels=512,
                     pool_scales=(1, 2, 3, 6), dropout_ratio=0.1, num_classes=150,
                     norm_cfg=norm_cfg),
    auxiliary_head=dict(in_channels=embed_dims, in_index=3, channels=256, num_convs=1,
                        concat_input=False, dropout_ratio=0.1, num_classes=150,
                        norm_cfg=norm_cfg,
                        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False,
                                         loss_weight=0.4)),
    test_cfg=dict(_delete_=True, mode='whole'))

max_iters = 160000
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={'pos_embed': dict(decay_mult=0.),
                                    'cls_token': dict(decay_mult=0.),
                                    'norm': dict(decay_mult=0.)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=max_iters, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=16000)
# total batch 16 = 8 GPUs x 2 images (the official runs did not scale the lr)
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
auto_scale_lr = dict(enable=False, base_batch_size=16)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', by_epoch=False,
                                     interval=16000,
                                     backend_args=dict(backend='atomic_local')))
