# PlainMamba-L3 with a DynamicViT-style learned reducer at the budget of the published
# DynamicViT-on-PlainMamba-L3 row (8.37 GFLOPs, 1.46x; ToP-ViM rebuttal, its placement not
# public): keep predictors after layers 9 / 18 / 27 (counted from 1, ToP-ViM's L3 places;
# locations 8, 17, 26), rho 0.58 -> 113 / 65 / 38 of 196 tokens, 8.385 GFLOPs in the official
# convention (predictors included). Training: PlainMamba's masked forward (the 7x7 conv sees the
# dropped cells as zero, every snake direction scans the kept tokens first with delta / B / C
# of the kept tokens in raster order), equal to the pruned inference without alignment.
# DynamicViT's recipe (as configs/vim/vim-s_linear_8xb128-30e_in1k-224_dynamicvit.py): 30
# epochs, AdamW wd 0.05, lr 1e-3 predictors / x0.01 the rest, backbone held 5 epochs, cosine.
#   python tools/train.py THIS_CONFIG --cfg-options load_from=pretrain/l3.pth
# Results of this config are "fine-tuned 30 epochs", not training-free.
_base_ = ['./plainmamba-l3_linear_4xb256-300e_in1k-224.py']
model = dict(
    _delete_=True, type='ReducerFineTuner', logit_weight=0.5, token_weight=0.5,
    model=dict(_base_.model, backbone=dict(
        _base_.model.backbone,
        token_reduction=dict(type='DynamicViT', keep_rate=0.58, locations=(8, 17, 26),
                             ratio_weight=2.0))))
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05, eps=1e-8, betas=(0.9, 0.999)),
    clip_grad=dict(max_norm=1.0),
    paramwise_cfg=dict(custom_keys={
        'student': dict(lr_mult=0.01),
        'student.backbone.token_reducer': dict(lr_mult=1.0),
        'student.backbone.pos_embed': dict(lr_mult=0.0, decay_mult=0.0),
    }))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, end=5, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=5, end=30,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=30, val_interval=1)
custom_hooks = [dict(type='FrozenWarmupHook', module='student.backbone', epochs=5)]
