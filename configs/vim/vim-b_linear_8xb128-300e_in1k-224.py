# Vim-B ImageNet-1k classifier (official head as LinearClsHead), total batch 1024
# (8 GPUs x 128), 300 epochs, AdamW lr 1e-3 wd 0.05, 5 warm-up epochs + cosine (DeiT/Vim
# recipe), drop path 0.5 (our reading of the official training scripts).
# Evaluate the official checkpoint (published Top-1 81.9):
#   python tools/test.py THIS_CONFIG vim_b_midclstok_*.pth
# (official files are converted on the fly; tools/model_converters/vim2amvim_mm.py does it once).
_base_ = ['../_base_/imagenet_linear-224.py']
embed_dims = 768
model = dict(backbone=dict(type='Vim', arch='base', drop_path_rate=0.5),
             head=dict(in_channels=embed_dims))
