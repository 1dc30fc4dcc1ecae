# Vim-S + PlainPyramidNeck + UperNet on ADE20K with a DynamicViT-style learned reducer
# (rho 0.7 after 0-based blocks 5, 11, 17 of the 1024-token 512x512 grid: 716 / 501 / 351 kept),
# fine-tuned from a trained segmentation model. Dense restore (DyVM-style): a dropped token's
# features stay those it had when it was dropped, in training (masked forward) and inference
# (frozen grid). No published recipe for this: our choice is 16k iterations, AdamW lr 1e-4 for
# the keep predictors and x0.1 for everything else, the backbone held for the first 1.6k
# iterations, poly decay; losses = the decode heads' + keep ratio (weight 2.0) + 0.5 token MSE
# against the unreduced teacher (no logit term: mmseg heads have no class logits per image).
#   python tools/train.py THIS_CONFIG --cfg-options load_from=work_dirs/vim-s_.../iter_160000.pth
# Results of this config are "fine-tuned 16k iterations", not training-free.
_base_ = ['./vim-s_pyramid_upernet_8xb2-160k_ade20k-512x512_paper-text.py']
model = dict(
    _delete_=True, type='ReducerFineTuner', logit_weight=0.0, token_weight=0.5,
    model=dict(_base_.model, backbone=dict(
        _base_.model.backbone, init_cfg=None,
        token_reduction=dict(type='DynamicViT', keep_rate=0.7, locations=(5, 11, 17),
                             ratio_weight=2.0))))
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={
        'student': dict(lr_mult=0.1),
        'student.backbone.token_reducer': dict(lr_mult=1.0),
        'student.backbone.pos_embed': dict(lr_mult=0.0, decay_mult=0.0),
    }))
param_scheduler = [dict(type='PolyLR', eta_min=0.0, power=1.0, begin=0, end=16000,
                        by_epoch=False)]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=16000, val_interval=4000)
custom_hooks = [dict(type='FrozenWarmupHook', module='student.backbone', iters=1600)]
