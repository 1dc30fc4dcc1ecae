# AMViL-T: ViL-T whose bottom-right traversal (the flipped one) is AMVim's windowed scan (the
# AMVim authors' proposal for ViL), + PlainPyramidNeck + UperNet, ADE20K 512x512, the ViL-T
# recipe (../vil/vil-t_pyramid_upernet_8xb2-160k_ade20k-512x512.py). No published number (the
# model is new). A ViL-T file loads 1:1.
_base_ = ['../vil/vil-t_pyramid_upernet_8xb2-160k_ade20k-512x512.py']
model = dict(backbone=dict(type='AMViL'))
