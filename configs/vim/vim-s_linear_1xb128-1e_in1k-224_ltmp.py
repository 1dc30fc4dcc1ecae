# Vim-S with LTMP-style learned thresholds, fine-tuned one epoch with LTMP's recipe (the
# thresholds only; as the Vim-T config it inherits) from a trained Vim-S classifier:
#   python tools/train.py THIS_CONFIG --cfg-options load_from=vim_s_midclstok_80p5acc.pth
# Results of this config are "fine-tuned 1 epoch", not training-free.
_base_ = ['./vim-t_linear_1xb128-1e_in1k-224_ltmp.py']
model = dict(model=dict(backbone=dict(arch='small', drop_path_rate=0.05),
                        head=dict(in_channels=384)))
