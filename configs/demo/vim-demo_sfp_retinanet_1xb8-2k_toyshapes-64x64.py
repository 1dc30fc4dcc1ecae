# Demo Vim (D 64, 8 blocks, patch 8) + simple feature pyramid + RetinaNet on the toy shapes (COCO).
_base_ = ['../_base_/demo_toyshapes-coco-64x64.py']
