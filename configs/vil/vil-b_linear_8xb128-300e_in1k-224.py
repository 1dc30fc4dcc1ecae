# ViL-B (Vision-LSTM v2) ImageNet-1k classifier: the official head as LinearClsHead on the
# pooled features (bilateral concat of the first and last token, 2 x 768). Evaluate the
# released checkpoint (published top-1 82.4 %):
#   python tools/test.py THIS_CONFIG vil2-base.th
# Training recipe: the DeiT/Vim one of ../_base_/imagenet_linear-224.py (the official ViL v2
# pre-trains at 192 px, then fine-tunes at 224: not reproduced here).
_base_ = ['../_base_/imagenet_linear-224.py']
embed_dims = 768
model = dict(backbone=dict(_delete_=True, type='ViL', arch='base', img_size=224,
                           out_type='pooled', drop_path_rate=0.0),
             head=dict(in_channels=2 * embed_dims))
