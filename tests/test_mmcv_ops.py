"""mmcv's compiled ops (built from source in our environment) work on CPU tensors."""
import numpy as np
import torch

import mmcv.ops as ops  # a hard import: these ops must be compiled


def _boxes():
    boxes = torch.tensor([
        [0., 0., 10., 10.],   # 0: best box
        [1., 1., 11., 11.],   # 1: IoU 81/119 = 0.68 with box 0 -> suppressed
        [20., 20., 30., 30.],  # 2: disjoint -> kept
        [0., 0., 10., 10.5],  # 3: IoU 100/105 with box 0 -> suppressed
        [5., 0., 15., 10.],   # 4: IoU 50/150 = 0.33 with box 0 -> kept
    ])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5])
    return boxes, scores


def test_nms_keeps_the_right_boxes():
    boxes, scores = _boxes()
    dets, keep = ops.nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2, 4]
    assert dets.shape == (3, 5)
    torch.testing.assert_close(dets[:, :4], boxes[keep])
    torch.testing.assert_close(dets[:, 4], scores[keep])
    # A stricter threshold also removes box 4; a looser one keeps box 1.
    assert ops.nms(boxes, scores, iou_threshold=0.3)[1].tolist() == [0, 2]
    assert ops.nms(boxes, scores, iou_threshold=0.7)[1].tolist() == [0, 1, 2, 4]
    # numpy in -> numpy out
    dets_np, keep_np = ops.nms(boxes.numpy(), scores.numpy(), iou_threshold=0.5)
    assert isinstance(keep_np, np.ndarray) and keep_np.tolist() == [0, 2, 4]


def test_batched_nms_is_per_class():
    boxes, scores = _boxes()
    idxs = torch.tensor([0, 1, 0, 0, 0])  # box 1 is another class: not suppressed by box 0
    _, keep = ops.batched_nms(boxes, scores, idxs, dict(type='nms', iou_threshold=0.5))
    assert sorted(keep.tolist()) == [0, 1, 2, 4]


def test_roi_align_constant_map_returns_the_constant():
    feat = torch.empty(2, 3, 8, 8)
    for c, v in enumerate([3.0, -1.5, 0.25]):
        feat[:, c] = v
    rois = torch.tensor([[0., 1., 1., 5., 5.], [1., 2., 0., 7., 6.], [0., 0., 0., 8., 8.]])
    layer = ops.RoIAlign(output_size=(2, 2), spatial_scale=1.0, sampling_ratio=2, aligned=True)
    out = layer(feat, rois)
    assert out.shape == (3, 3, 2, 2)
    expected = torch.tensor([3.0, -1.5, 0.25]).view(1, 3, 1, 1).expand_as(out)
    torch.testing.assert_close(out, expected)


def test_roi_align_linear_ramp_and_backward():
    # value at pixel (y, x) = x: bilinear sampling of a linear map is exact
    feat = torch.arange(8.).view(1, 1, 1, 8).expand(1, 1, 8, 8).contiguous().requires_grad_()
    rois = torch.tensor([[0., 2., 2., 6., 6.]])
    out = ops.roi_align(feat, rois, (2, 2), 1.0, 2, 'avg', True)
    # aligned=True shifts by half a pixel: x bins [1.5, 3.5] and [3.5, 5.5]
    torch.testing.assert_close(out, torch.tensor([[[[2.5, 4.5], [2.5, 4.5]]]]))
    out.sum().backward()
    # every output bin averages samples inside the map: the weights of each bin sum to 1
    torch.testing.assert_close(feat.grad.sum(), torch.tensor(4.0))
    assert (feat.grad >= 0).all()
