# The demo AMVim segmenter with a DynamicViT-style learned reducer, fine-tuned 600 iterations from
# the trained demo checkpoint: the Vim demo's fine-tuning config (schedule, losses and recipe)
# with the AMVim model (same parameters; each path scans the kept tokens in its own order).
#   python tools/train.py THIS_CONFIG --cfg-options randomness.seed=S \
#       load_from=checkpoints/demo/amvim-demo-seedS_toyshapes-64x64.pth
# Its results are "fine-tuned 600 iterations" (configs/demo/README.md has the table).
_base_ = ['./vim-demo_pyramid_upernet_1xb8-600i_toyshapes-64x64_dynamicvit.py']
model = dict(model=dict(backbone=dict(type='AMVim')))
load_from = 'checkpoints/demo/amvim-demo-seed0_toyshapes-64x64.pth'
