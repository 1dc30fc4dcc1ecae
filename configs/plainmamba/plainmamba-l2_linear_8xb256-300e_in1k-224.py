# PlainMamba-L2 ImageNet-1k classifier, total batch 2048 (8 GPUs x 256), 300 epochs, as the
# official plain_mamba_l2_in1k_300e.py. Recipe: ./plainmamba-l1_linear_8xb256-300e_in1k-224.py
# with C = 384, drop path 0.2, gradient clipping at 1.0, 20 warm-up epochs (official EMA not set).
# Evaluate the released file (published Top-1 81.6 / Top-5 95.6, 25.7M params, 8.1G FLOPs):
#   python tools/test.py THIS_CONFIG pretrain/l2.pth
_base_ = ['./plainmamba-l1_linear_8xb256-300e_in1k-224.py']
embed_dims = 384
lr = 5e-4 * 256 * 8 / 512
model = dict(backbone=dict(arch='l2', drop_path_rate=0.2), head=dict(in_channels=embed_dims))
optim_wrapper = dict(optimizer=dict(lr=lr), clip_grad=dict(max_norm=1.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=20, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=lr * 1e-2, by_epoch=True, begin=20, end=300,
         convert_to_iter_based=True),
]
