# The detection demo: a small Vim-family model + SimpleFeaturePyramid + RetinaNet on the
# detection version of the toy shapes (amvim_mm.datasets.make_toy_shapes_coco: the same images
# as the segmentation demo, COCO layout, one box per shape), trained on a CPU in minutes.
# Backbone as the segmentation demo (D 64, 8 blocks, patch 8: an 8x8 grid) with the last
# block's feature map; pyramid scales 2, 1, 0.5 (strides 4, 8, 16), 64 channels; RetinaNet
# head with 2 stacked convs of 64 channels, 4 classes. AdamW lr 1e-3, wd 0.01, batch 8,
# 2000 iterations, 100 warm-up iterations then poly decay. Single process.
_base_ = [
    'mmdet::_base_/models/retinanet_r50_fpn.py',
    'mmdet::_base_/default_runtime.py',
    './demo_schedule_adamw-2k.py',
]
custom_imports = dict(imports=['amvim_mm', 'amvim_mm.datasets'], allow_failed_imports=False)

embed_dims = 64
demo_arch = dict(embed_dims=embed_dims, num_layers=8, d_state=8)
model = dict(
    data_preprocessor=dict(pad_size_divisor=16),
    backbone=dict(
        _delete_=True, type='Vim', arch=demo_arch, img_size=64, patch_size=8, stride=8,
        out_type='featmap', out_indices=(7, ), with_cls_token=False, final_norm=False,
        drop_path_rate=0.0),
    neck=dict(_delete_=True, type='SimpleFeaturePyramid', in_channels=embed_dims,
              out_channels=64, scales=(2, 1, 0.5), norm_cfg=dict(type='LN2d'), num_outs=3),
    bbox_head=dict(num_classes=4, in_channels=64, feat_channels=64, stacked_convs=2,
                   anchor_generator=dict(strides=[4, 8, 16])))

data_root = 'data/toy_shapes_coco'
metainfo = dict(classes=('disk', 'square', 'triangle', 'ring'))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(64, 64), keep_ratio=True),   # a no-op that sets scale_factor
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(64, 64), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    batch_sampler=None,
    dataset=dict(type='CocoDataset', data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_train2017.json',
                 data_prefix=dict(img='train2017/'), filter_cfg=dict(filter_empty_gt=True),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False, drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='CocoDataset', data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_val2017.json',
                 data_prefix=dict(img='val2017/'), test_mode=True, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='CocoMetric', ann_file=data_root + '/annotations/instances_val2017.json',
                     metric='bbox', format_only=False)
test_evaluator = val_evaluator

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    checkpoint=dict(type='AtomicCheckpointHook', by_epoch=False, interval=500, max_keep_ckpts=2,
                    save_last=True, backend_args=dict(backend='atomic_local')))
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)
