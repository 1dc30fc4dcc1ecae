# Recipe: paper text (Vim, Appendix B): AMVim-S + PlainPyramidNeck + UperNet, ADE20K 512x512, total
# batch 16 (8 GPUs x 2), 160k iterations, AdamW lr 6e-5, wd 0.01
# (../_base_/upernet_ade20k-512x512.py).
# Not the run behind any published number: the official code ran another recipe
# (./amvim-s_pyramid_upernet_4xb8-60k_ade20k-512x512_official-code.py, the one
# for reproduction). The AMVim paper's Table 4 states no recipe of its own.
# Initialised from the released ImageNet weights (vim_s_midclstok_80p5acc.pth);
# AMVim loads the Vim file 1:1.
# The Vim config with the AMVim backbone (same parameters and keys: the Vim file loads 1:1).
_base_ = ['../vim/vim-s_pyramid_upernet_8xb2-160k_ade20k-512x512_paper-text.py']
model = dict(backbone=dict(type='AMVim'))
