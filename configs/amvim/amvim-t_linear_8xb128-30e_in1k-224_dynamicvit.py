# AMVim-T with a DynamicViT-style learned reducer (Vim-T's setting: rho 0.9 before blocks 6, 12
# and 18), fine-tuned 30 epochs with DynamicViT's recipe from a trained AMVim-T classifier:
#   python tools/train.py THIS_CONFIG --cfg-options load_from=AMVIM_T.pth
# The masks enter every window path exactly (kept tokens first in each path's order).
# Results of this config are "fine-tuned 30 epochs", not training-free.
_base_ = ['../vim/vim-t_linear_8xb128-30e_in1k-224_dynamicvit.py']
model = dict(model=dict(backbone=dict(type='AMVim', drop_path_rate=0.05)))
