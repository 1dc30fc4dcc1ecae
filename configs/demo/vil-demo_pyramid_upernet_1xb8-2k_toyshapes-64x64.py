# Demo ViL (Vision-LSTM v2: D 64, 4 block pairs, patch 8: an 8x8 token grid as the Vim demo) +
# pyramid + UperNet on the built-in toy shapes. Same recipe, data and decoder as the Vim, AMVim
# and PlainMamba demos (`python tools/demo.py --families vil amvil`).
_base_ = ['../_base_/demo_toyshapes-64x64.py']
model = dict(
    backbone=dict(
        _delete_=True, type='ViL', arch=dict(embed_dims=64, num_layers=4, patch_size=8),
        img_size=64, out_indices=(0, 1, 2, 3), drop_path_rate=0.0))
