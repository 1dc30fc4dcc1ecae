# AMVim-T with a DynamicViT-style learned reducer (Vim-T's setting: rho 0.9 before blocks 6, 12
# and 18), fine-tuned 30 epochs with DynamicViT's recipe from a trained AMVim-T classifier:
#   python tools/train.py THIS_CONFIG --cfg-options load_from=AMVIM_T.pth
# The masks enter every window path exactly (kept tokens first in each path's order).
# Results of this config are "fine-tuned 30 epochs", not training-free.
_base_ = ['./amvim-t_linear_8xb128-150e_in1k-224.py', '../_base_/dynamicvit_finetune-30e.py']
model = dict(
    _delete_=True, type='ReducerFineTuner', logit_weight=0.5, token_weight=0.5,
    model=dict(_base_.model, backbone=dict(
        _base_.model.backbone,
        token_reduction=dict(type='DynamicViT', keep_rate=0.9, locations=(5, 11, 17),
                             ratio_weight=2.0))))
