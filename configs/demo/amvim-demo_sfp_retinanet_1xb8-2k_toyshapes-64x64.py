# Demo AMVim: the Vim detection demo with AMVim's scan paths (same parameters).
_base_ = ['../_base_/demo_toyshapes-coco-64x64.py']
model = dict(backbone=dict(type='AMVim'))
