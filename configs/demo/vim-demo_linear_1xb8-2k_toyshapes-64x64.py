# Demo Vim classifier (D 64, 8 blocks, patch 8, pooled feature map) on the toy shapes (classes).
_base_ = ['../_base_/demo_toyshapes-cls-64x64.py']
