# The "official code" recipe of Vim / AMVim UperNet on ADE20K: what hustvl/Vim's segmentation
# code ran for the published numbers (seg/configs/vim/upernet/upernet_vim_{tiny,small}_24_512_
# slide_60k.py with seg/scripts/ft_vim_{tiny,small}_upernet.sh). On top of the model and data of
# ./upernet_ade20k-512x512.py (auxiliary head on the x1 map):
#   * 60k iterations, total batch 32 (4 GPUs x 8; the scripts ran >= 1 node of 4 GPUs), linear
#     warm-up 1500 iterations from 1e-6, then poly power 1.0 to 0;
#   * AdamW (0.9, 0.999); lr and weight decay per model in the leaf configs (T: 2e-4 / 0.1,
#     S: 1e-4 / 0.05);
#   * layer decay as the official constructor applies it: it assigns depths to
#     `backbone.blocks.*`, a name the Vim backbone does not have, so every block, the neck and
#     the heads train at the full lr and only the patch / position embeddings get rate**25
#     (layer_decay_scope='embeddings'); weight decay on everything but 1-D parameters (biases,
#     norms, D): pos_embed and A_log are decayed (its no-decay list compares unprefixed names);
#   * no AMP; validation and a checkpoint every 1000 iterations, the 4 newest kept, and the best
#     on val mIoU kept as best_mIoU_iter_*.pth (the official code evaluated that one).
# A different total batch: keep the lr (the official runs did not scale it) or enable
# auto_scale_lr (base_batch_size 32).
_base_ = ['./upernet_ade20k-512x512.py']

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-4, betas=(0.9, 0.999), weight_decay=0.1),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.92, layer_decay_scope='embeddings',
                       flat_decay_mult=0.0, no_decay_leaves=()))
max_iters = 60000
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=max_iters, by_epoch=False),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=1000)
# total batch 32 = 4 GPUs x 8 images
train_dataloader = dict(batch_size=8)
auto_scale_lr = dict(enable=False, base_batch_size=32)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook', by_epoch=False, interval=1000,
                                     max_keep_ckpts=4, save_best='mIoU', rule='greater',
                                     backend_args=dict(backend='atomic_local')))
