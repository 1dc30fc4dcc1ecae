# Vim-S with a DynamicViT-style learned reducer (DyVM's locations: before blocks 6, 12 and 18,
# i.e. after 0-based blocks 5, 11, 17; keep rho = 0.7 -> 137 / 96 / 67 of 196 tokens), fine-tuned
# 30 epochs with DynamicViT's recipe (below; Vim-T and AMVim-T inherit it) from a trained Vim-S:
#   python tools/train.py THIS_CONFIG --cfg-options load_from=vim_s_midclstok_80p5acc.pth
#   python tools/test.py THIS_CONFIG work_dirs/.../epoch_30.pth
# Published anchors (not reproduced here): DynamicViT on ViM-S 3.56 GFLOPs, 1.30x throughput
# (ToP-ViM rebuttal); DyVM-Vim-S 78.8 % (token + block pruning). Every result of this config is
# "fine-tuned 30 epochs", not training-free.
_base_ = ['./vim-s_linear_8xb128-300e_in1k-224.py']
model = dict(
    _delete_=True, type='ReducerFineTuner', logit_weight=0.5, token_weight=0.5,
    model=dict(_base_.model, backbone=dict(
        _base_.model.backbone,
        token_reduction=dict(type='DynamicViT', keep_rate=0.7, locations=(5, 11, 17),
                             ratio_weight=2.0))))
# DynamicViT's fine-tuning recipe for a learned reducer on a trained ImageNet classifier
# (github raoyongming/DynamicViT README / main.py / engine.py), used by the *_dynamicvit.py
# configs: 30 epochs; AdamW wd 0.05; lr 1e-3 for the keep predictors, x0.01 for everything else
# (--lr_scale); the backbone held fixed for the first 5 epochs (fix_step=5, FrozenWarmupHook);
# 5 linear warm-up epochs then cosine to 1e-6; the class token and position embedding frozen.
# The model is ReducerFineTuner: the student with the reducer, the unreduced teacher, CE + keep
# ratio loss (ratio_weight 2.0) + 0.5 logit KL + 0.5 token MSE. Start from a trained model:
#   python tools/train.py THIS_CONFIG --cfg-options load_from=TRAINED.pth
# (a checkpoint of the plain classifier: it initialises the student and the teacher).
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999)),
    paramwise_cfg=dict(custom_keys={
        'student': dict(lr_mult=0.01),
        'student.backbone.token_reducer': dict(lr_mult=1.0),
        'student.backbone.pos_embed': dict(lr_mult=0.0, decay_mult=0.0),
        'student.backbone.cls_token': dict(lr_mult=0.0, decay_mult=0.0),
    }))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=5, end=30),
]
train_cfg = dict(by_epoch=True, max_epochs=30, val_interval=1)
custom_hooks = [dict(type='FrozenWarmupHook', module='student.backbone', epochs=5)]
