# Demo Vim (D 64, 8 blocks, patch 8) + Segmenter's mask transformer on the kept tokens
# (TokenMaskTransformerHead: 1 layer, 4 heads, 64 dims) on the built-in toy shapes; the last
# block's output with the final norm (out_type='tokens'). Otherwise the demo's recipe.
_base_ = ['../_base_/demo_toyshapes-64x64.py']
model = dict(
    backbone=dict(out_type='tokens', out_indices=(-1, ), final_norm=True),
    neck=None,
    decode_head=dict(_delete_=True, type='TokenMaskTransformerHead', in_channels=64,
                     channels=64, num_classes=5, num_layers=1, num_heads=4, embed_dims=64,
                     dropout_ratio=0.0, drop_path_rate=0.0,
                     loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False,
                                      loss_weight=1.0)))
