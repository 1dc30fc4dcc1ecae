# Vim-T with LTMP-style learned thresholds (merge + prune before every block but the first, 2 scalars
# a block; amvim_mm/models/reduction/ltmp.py), fine-tuned one epoch with LTMP's recipe
# (below, the thresholds only; Vim-S and AMVim-T inherit it) from a trained Vim-T classifier:
#   python tools/train.py THIS_CONFIG --cfg-options load_from=TRAINED.pth
#   python tools/prune_eval.py THIS_CONFIG work_dirs/.../epoch_1.pth --methods learned tome --ratios 0 0.25
# The token counts depend on the image: inference runs image by image and GFLOPs are the mean
# over the evaluated images. Results of this config are "fine-tuned 1 epoch", not training-free.
_base_ = ['./vim-t_linear_8xb128-300e_in1k-224.py']
model = dict(
    _delete_=True, type='ReducerFineTuner', logit_weight=0.0, token_weight=0.0,
    train_only_reducer=True,
    model=dict(_base_.model, train_cfg=None, backbone=dict(
        _base_.model.backbone,
        token_reduction=dict(type='LTMP', merge_init=0.9, prune_init=0.0, tau=0.1, target=0.75,
                             reg_scale=10.0))))
# LTMP's fine-tuning recipe (github Mxbonn/ltmp README and tools/train.py), used by the *_ltmp.py
# configs: one epoch; only the thresholds train (ReducerFineTuner(train_only_reducer=True): every
# other parameter frozen, no teacher); SGD with momentum 0.9, weight decay 0; learning rate 5e-3
# for the merge thresholds and 5e-6 for the prune thresholds (--lr 0.000005 0.005); cosine, no
# warm-up; batch 128; label smoothing 0.1, no mixup / cutmix. Loss = the classifier's + the
# reducer's 10 * (r_FLOPs - 0.75)^2.
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='SGD', lr=5e-3, momentum=0.9, weight_decay=0.0),
    paramwise_cfg=dict(custom_keys={'prune_thresholds': dict(lr_mult=1e-3)}))
param_scheduler = [dict(type='CosineAnnealingLR', eta_min=0.0, by_epoch=True, begin=0, end=1,
                        convert_to_iter_based=True)]
train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=1)
train_dataloader = dict(batch_size=128)
