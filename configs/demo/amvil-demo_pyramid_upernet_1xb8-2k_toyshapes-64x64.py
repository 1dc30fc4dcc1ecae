# Demo AMViL: the ViL demo whose bottom-right traversal is AMVim's windowed scan
# (`python tools/demo.py --families vil amvil`).
_base_ = ['./vil-demo_pyramid_upernet_1xb8-2k_toyshapes-64x64.py']
model = dict(backbone=dict(type='AMViL'))
