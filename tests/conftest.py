"""Shared pytest fixtures: tiny datasets in the real layouts and an isolated mmengine scope;
the thread share of a pytest-xdist worker."""
import os

import pytest

from amvim_mm.testing import make_ade20k, make_coco, make_imagenet


def pytest_configure(config):
    """Under pytest-xdist (``bash run.sh test`` runs one worker per core) every worker gets
    its share of the cores, for its own torch ops and for the tool processes its tests start
    (``OMP_NUM_THREADS``, unless a test sets it): torch processes whose OpenMP threads spin on
    the same cores run many times slower than their share."""
    workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '0') or 0)
    if workers > 1:
        import torch
        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ['OMP_NUM_THREADS'] = os.environ['MKL_NUM_THREADS'] = str(share)
        torch.set_num_threads(share)


@pytest.fixture
def tmp_ade20k(tmp_path_factory):
    """An ADEChallengeData2016-style folder: 4 training and 2 validation 64x64 images."""
    return make_ade20k(tmp_path_factory.mktemp('ade20k'), num_train=4, num_val=2, seed=0)


@pytest.fixture
def tmp_coco(tmp_path_factory):
    """A COCO-2017-style folder: 4 train2017 and 4 val2017 64x64 images, 80 categories."""
    return make_coco(tmp_path_factory.mktemp('coco'), num_images=4, seed=0)


@pytest.fixture
def tmp_imagenet(tmp_path_factory):
    """An mmpretrain ImageNet-style folder: 3 classes x 2 images in train/ and in val/."""
    return make_imagenet(tmp_path_factory.mktemp('imagenet'), num_classes=3, per_class=2, seed=0)


@pytest.fixture(autouse=True)
def _isolated_default_scope():
    """Undo any mmengine ``DefaultScope`` a test creates.

    ``init_default_scope``, ``register_all_modules()`` and every ``Runner`` create a global
    ``DefaultScope`` instance that stays the "current" scope for the rest of the process, so one
    test that builds in the ``mmseg`` scope would silently change how a later test's
    ``MODELS.build`` / ``TRANSFORMS.build`` resolve type names. Restore the instances afterwards.
    """
    from mmengine.registry import DefaultScope
    before = list(DefaultScope._instance_dict)
    yield
    for name in list(DefaultScope._instance_dict):
        if name not in before:
            DefaultScope._instance_dict.pop(name, None)


@pytest.fixture
def exact_fp32():
    """fp32 matmuls and convolutions without TF32 on CUDA (for tight GPU comparisons)."""
    import torch
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old
