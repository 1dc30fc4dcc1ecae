"""One of mmseg's own configs with its ViT backbone swapped for AMVim by a config override.

This is the config a user writes next to mmseg's
``vit/vit_vit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py`` (ViT-B + MultiLevelNeck + UperNet)
to run it with AMVim (here the CPU-sized ``test`` architecture, D = 32, at 64x64; for the real
model use ``arch='tiny'``, ``img_size=512``, ``out_indices=(5, 11, 17, 23)`` and 192 channels)::

    _base_ = ['mmseg::vit/vit_vit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py']
    custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)
    norm_cfg = dict(type='BN', requires_grad=True)  # one process; keep SyncBN on several GPUs
    model = dict(
        pretrained=None,  # the base sets a ViT file, which mmseg hands to the backbone
        data_preprocessor=dict(size=(64, 64)),
        backbone=dict(_delete_=True, type='AMVim', arch='test', img_size=64,
                      out_type='featmap', out_indices=(0, 1, 2, 3)),
        neck=dict(in_channels=[32] * 4, out_channels=32),
        decode_head=dict(in_channels=[32] * 4, channels=32, norm_cfg=norm_cfg),
        auxiliary_head=dict(in_channels=32, channels=16, norm_cfg=norm_cfg))

``pretrained=None`` is needed because mmseg's ``EncoderDecoder`` copies a model-level
``pretrained`` into the backbone config, and the Vim family takes its weights through
``init_cfg=dict(type='Pretrained', checkpoint=...)`` instead.
"""
import textwrap

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

BASE = 'mmseg::vit/vit_vit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py'
SIZE = 64
D = 32

# the override of the module docstring, as a file
USER_CONFIG = textwrap.dedent(f"""\
    _base_ = ['{BASE}']
    custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)
    norm_cfg = dict(type='BN', requires_grad=True)  # one process; keep SyncBN on several GPUs
    model = dict(
        pretrained=None,  # the base sets a ViT file, which mmseg hands to the backbone
        data_preprocessor=dict(size=({SIZE}, {SIZE})),
        backbone=dict(_delete_=True, type='AMVim', arch='test', img_size={SIZE},
                      out_type='featmap', out_indices=(0, 1, 2, 3)),
        neck=dict(in_channels=[{D}] * 4, out_channels={D}),
        decode_head=dict(in_channels=[{D}] * 4, channels={D}, norm_cfg=norm_cfg),
        auxiliary_head=dict(in_channels={D}, channels=16, norm_cfg=norm_cfg))
    """)

pytestmark = [
    pytest.mark.filterwarnings('ignore:``build_loss`` would be deprecated:UserWarning'),
    pytest.mark.filterwarnings('ignore:Default ``avg_non_ignore`` is False:UserWarning'),
]


def test_docstring_quotes_the_tested_config():
    """The README quotes the module docstring: keep it equal to what is tested."""
    doc = textwrap.dedent(__doc__.split('::\n\n', 1)[1].split('\n\n')[0])
    assert doc.strip() == USER_CONFIG.replace(f'{SIZE}', '64').replace(f'{D}', '32').strip()


def _mmseg_config_path(name):
    """``mmseg::x.py`` -> the file mmseg installs (``Config.fromfile`` takes only ``_base_``
    entries in the ``mmseg::`` form, not a top-level file)."""
    import os.path as osp

    from mmengine.utils import get_installed_path
    assert name.startswith('mmseg::')
    path = osp.join(get_installed_path('mmsegmentation'), '.mim', 'configs',
                    name[len('mmseg::'):])
    assert osp.isfile(path), path
    return path


def _build(cfg):
    from mmseg.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmseg'):
        return MODELS.build(cfg.model)


def _batch(n=2, seed=0):
    from mmseg.structures import SegDataSample
    from mmengine.structures import PixelData
    g = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for _ in range(n):
        inputs.append(torch.randint(0, 256, (3, SIZE, SIZE), generator=g, dtype=torch.uint8))
        seg = torch.randint(0, 150, (1, SIZE, SIZE), generator=g)
        s = SegDataSample(metainfo=dict(img_shape=(SIZE, SIZE), ori_shape=(SIZE, SIZE),
                                        pad_shape=(SIZE, SIZE)))
        s.gt_sem_seg = PixelData(data=seg)
        samples.append(s)
    return dict(inputs=inputs, data_samples=samples)


def _check_model(cfg):
    assert cfg.default_scope == 'mmseg'
    assert cfg.model.backbone.type == 'AMVim'
    # _delete_ dropped every ViT argument
    assert 'num_heads' not in cfg.model.backbone and 'mlp_ratio' not in cfg.model.backbone
    assert cfg.model.neck.type == 'MultiLevelNeck'
    assert cfg.model.decode_head.type == 'UPerHead'
    model = _build(cfg)
    assert type(model.backbone).__name__ == 'AMVim'
    assert model.backbone.embed_dims == D and model.backbone.out_indices == [0, 1, 2, 3]

    # loss: one training step's forward/backward on a 64x64 batch
    model.train()
    data = model.data_preprocessor(_batch(), True)
    losses = model(**data, mode='loss')
    assert {'decode.loss_ce', 'aux.loss_ce'} <= set(losses), losses.keys()
    total = sum(v for k, v in losses.items() if 'loss' in k)
    assert torch.isfinite(total)
    total.backward()
    grad = model.backbone.layers[0].mixer.in_proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0

    # inference: tensor output and a full test_step back to the image size
    model.eval()
    with torch.no_grad():
        out = model(torch.rand(2, 3, SIZE, SIZE), mode='tensor')
        assert out.shape[:2] == (2, 150) and torch.isfinite(out).all()
        preds = model.test_step(_batch(1, seed=1))
    assert preds[0].pred_sem_seg.data.shape == (1, SIZE, SIZE)
    assert int(preds[0].pred_sem_seg.data.max()) < 150


def test_user_config_file_swaps_the_backbone(tmp_path):
    path = tmp_path / 'amvim-test_mln_upernet_ade20k-64x64.py'
    path.write_text(USER_CONFIG)
    cfg = Config.fromfile(str(path))   # runs custom_imports: amvim_mm is imported here
    assert cfg.model.pretrained is None
    _check_model(cfg)


def test_merge_from_dict_swaps_the_backbone():
    """The same override applied to the loaded mmseg config in Python."""
    import amvim_mm  # noqa: F401  (Config.fromfile of the mmseg file does not import it)
    cfg = Config.fromfile(_mmseg_config_path(BASE))
    assert cfg.model.backbone.type == 'VisionTransformer'
    bn = dict(type='BN', requires_grad=True)
    cfg.merge_from_dict({
        'custom_imports': dict(imports=['amvim_mm'], allow_failed_imports=False),
        'model.pretrained': None,
        'model.data_preprocessor.size': (SIZE, SIZE),
        'model.backbone': dict(_delete_=True, type='AMVim', arch='test', img_size=SIZE,
                               out_type='featmap', out_indices=(0, 1, 2, 3)),
        'model.neck.in_channels': [D] * 4,
        'model.neck.out_channels': D,
        'model.decode_head.in_channels': [D] * 4,
        'model.decode_head.channels': D,
        'model.decode_head.norm_cfg': bn,
        'model.auxiliary_head.in_channels': D,
        'model.auxiliary_head.channels': 16,
        'model.auxiliary_head.norm_cfg': bn,
    })
    _check_model(cfg)


def test_without_pretrained_none_the_base_file_is_loaded_strictly(tmp_path):
    """Why the override sets ``pretrained=None``: mmseg passes the base's ``pretrained`` on to
    the backbone, which takes it as mmseg's backbones do (``init_cfg=Pretrained`` with mmseg's
    deprecation warning) and then loads that file strictly: here a ViT file that is not there."""
    path = tmp_path / 'cfg.py'
    path.write_text(USER_CONFIG.replace('        pretrained=None,', '', 1).replace(
        "    pretrained=None,  # the base sets a ViT file, which mmseg hands to the backbone\n",
        ''))
    cfg = Config.fromfile(str(path))
    assert cfg.model.pretrained == 'pretrain/vit_base_patch16_224.pth'
    with pytest.warns(UserWarning, match='pretrained is deprecated'):
        model = _build(cfg)
    assert model.backbone.init_cfg == dict(type='Pretrained',
                                           checkpoint='pretrain/vit_base_patch16_224.pth')
    with pytest.raises(FileNotFoundError, match='pretrain/vit_base_patch16_224.pth'):
        model.init_weights()
