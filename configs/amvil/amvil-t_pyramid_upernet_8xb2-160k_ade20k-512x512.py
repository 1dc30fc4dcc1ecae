# Recipe: ours: ViL v2 weights on the Vim/AMVim recipe for a like-for-like comparison; not a
# reproduction; no published number applies (AMViL is new: no paper reports it; the official
# ViL recipe is ../vil/vil-t-v1_pyramid_upernet_1xb16-160k_ade20k-512x512_official-code.py).
# AMViL-T: ViL-T whose bottom-right traversal (the flipped one) is AMVim's windowed scan (the
# AMVim authors' proposal for ViL), + PlainPyramidNeck + UperNet, ADE20K 512x512, everything else
# as ../vil/vil-t_pyramid_upernet_8xb2-160k_ade20k-512x512.py. A ViL-T v2 file (vil2-tiny.th)
# loads 1:1.
_base_ = ['../vil/vil-t_pyramid_upernet_8xb2-160k_ade20k-512x512.py']
model = dict(backbone=dict(type='AMViL'))
