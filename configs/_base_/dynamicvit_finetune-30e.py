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
