# AMVim-T with LTMP-style learned thresholds, fine-tuned one epoch with LTMP's recipe (the
# thresholds only; as the Vim-T config it inherits) from a trained AMVim-T classifier:
#   python tools/train.py THIS_CONFIG --cfg-options load_from=AMVIM_T.pth
# Results of this config are "fine-tuned 1 epoch", not training-free.
_base_ = ['../vim/vim-t_linear_1xb128-1e_in1k-224_ltmp.py']
model = dict(model=dict(backbone=dict(type='AMVim', drop_path_rate=0.05)))
