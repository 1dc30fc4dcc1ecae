# VMamba-T (s1l8) + FPN + Mask R-CNN on COCO, 3x schedule with multi-scale training, total
# batch 16 (8 GPUs x 2). The 1x recipe (./vmamba-t_fpn_mask-rcnn_8xb2-1x_coco-1333x800.py) with
# the official ms_3x changes, which equal mmdet's mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py:
# the DETR / Sparse R-CNN augmentation (random flip, then either a random short side in
# 480..800 step 32 with the long side <= 1333, or a random short side in {400, 500, 600},
# a random crop of 384..600 and a random short side in 480..800), 36 epochs, lr x 0.1 after
# epochs 27 and 33. Testing as 1x: single scale 1333 x 800.
# Published (VMamba, Mask R-CNN 3x, box AP / mask AP): T 48.8 / 43.7, S 49.9 / 44.2.
_base_ = ['./vmamba-t_fpn_mask-rcnn_8xb2-1x_coco-1333x800.py']

short_sides = [(s, 1333) for s in range(480, 801, 32)]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize', scales=short_sides, keep_ratio=True)],
            [
                dict(type='RandomChoiceResize', scales=[(400, 1333), (500, 1333), (600, 1333)],
                     keep_ratio=True),
                dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600),
                     allow_negative_crop=True),
                dict(type='RandomChoiceResize', scales=short_sides, keep_ratio=True),
            ],
        ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=1000),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[27, 33],
         gamma=0.1),
]
