# Vim-S with a DynamicViT-style learned reducer (DyVM's locations: before blocks 6, 12 and 18,
# i.e. after 0-based blocks 5, 11, 17; keep rho = 0.7 -> 137 / 96 / 67 of 196 tokens), fine-tuned
# 30 epochs with DynamicViT's recipe (../_base_/dynamicvit_finetune-30e.py) from a trained Vim-S:
#   python tools/train.py THIS_CONFIG --cfg-options load_from=vim_s_midclstok_80p5acc.pth
#   python tools/test.py THIS_CONFIG work_dirs/.../epoch_30.pth
# Published anchors (not reproduced here): DynamicViT on ViM-S 3.56 GFLOPs, 1.30x throughput
# (ToP-ViM rebuttal); DyVM-Vim-S 78.8 % (token + block pruning). Every result of this config is
# "fine-tuned 30 epochs", not training-free.
_base_ = ['./vim-s_linear_8xb128-300e_in1k-224.py', '../_base_/dynamicvit_finetune-30e.py']
model = dict(
    _delete_=True, type='ReducerFineTuner', logit_weight=0.5, token_weight=0.5,
    model=dict(_base_.model, backbone=dict(
        _base_.model.backbone,
        token_reduction=dict(type='DynamicViT', keep_rate=0.7, locations=(5, 11, 17),
                             ratio_weight=2.0))))
