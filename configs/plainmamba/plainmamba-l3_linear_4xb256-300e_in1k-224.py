# PlainMamba-L3 ImageNet-1k classifier, total batch 1024 (4 GPUs x 256), 300 epochs, as the
# official plain_mamba_l3_in1k_300e.py (world size 4). Recipe:
# ./plainmamba-l1_linear_8xb256-300e_in1k-224.py with C = 448 (36 layers), drop path 0.4,
# AdamW lr 1e-3 (5e-4 x 256 x 4 / 512), gradient clipping at 1.0, 20 warm-up epochs (official
# EMA not set).
# Evaluate the released file (published Top-1 82.3 / Top-5 95.9, 50.5M params, 14.4G FLOPs):
#   python tools/test.py THIS_CONFIG pretrain/l3.pth
_base_ = ['./plainmamba-l1_linear_8xb256-300e_in1k-224.py']
embed_dims = 448
lr = 5e-4 * 256 * 4 / 512
model = dict(backbone=dict(arch='l3', drop_path_rate=0.4), head=dict(in_channels=embed_dims))
optim_wrapper = dict(optimizer=dict(lr=lr), clip_grad=dict(max_norm=1.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=20, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=lr * 1e-2, by_epoch=True, begin=20, end=300,
         convert_to_iter_based=True),
]
auto_scale_lr = dict(enable=False, base_batch_size=1024)
