# Demo PlainMamba (C 64, 8 layers, patch 8: an 8x8 token grid as the Vim demo; d_state 8, one
# extra stem conv and a depthwise block after layer 0 as L1) + pyramid + UperNet on the built-in
# toy shapes. Same recipe, data and decoder as the Vim and AMVim demos.
_base_ = ['../_base_/demo_toyshapes-64x64.py']
model = dict(
    backbone=dict(
        _delete_=True, type='PlainMamba',
        arch=dict(embed_dims=64, num_layers=8, patch_size=8, d_state=8, num_convs_patch_embed=1,
                  layers_with_dwconv=(0, )),
        img_size=64, out_indices=(1, 3, 5, 7), drop_path_rate=0.0))
