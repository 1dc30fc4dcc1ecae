"""The cached ``package::`` lookups of ``load_config`` (amvim_mm.utils.config_lookup): the same
merged configs as mmengine's own parser, the same error for a missing base, mmengine's
functions restored after the parse."""
import glob
import os.path as osp

import mmengine.config.config as mm_config
import mmengine.config.utils as mm_utils
import pytest
from mmengine.config import Config

from amvim_mm.apis.runner import load_config
from amvim_mm.utils.config_lookup import cached_package_lookups

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = sorted(c for c in glob.glob(osp.join(ROOT, 'configs', '**', '*.py'), recursive=True)
                 if '_base_' not in c)
# one config per task and family with bases from each library (mmengine's parse is 0.5 s each)
SAMPLE = [c for c in CONFIGS if osp.basename(c) in (
    'vim-t_pyramid_upernet_8xb2-160k_ade20k-512x512_paper-text.py',
    'amvim-t_sfp_cascade-mask-rcnn_8xb8-lsj-184k_coco-1024x1024.py',
    'amvim-t_linear_8xb128-150e_in1k-224.py')]


def test_sample_covers_the_three_libraries():
    assert len(SAMPLE) == 3


@pytest.mark.parametrize('path', SAMPLE, ids=osp.basename)
def test_same_config_as_mmengine_parses_it(path, tmp_path):
    ours = load_config(path, work_dir=str(tmp_path)).to_dict()
    ref = Config.fromfile(path).to_dict()
    for d in (ours, ref):
        for k in ('work_dir', 'launcher', 'default_hooks'):   # what load_config sets
            d.pop(k, None)
    assert ours == ref
    assert mm_utils._get_cfg_metainfo.__module__ == 'mmengine.config.utils'   # restored
    assert mm_config.is_installed.__module__ == 'mmengine.utils.package_utils'


def test_missing_library_base_fails_as_in_mmengine(tmp_path):
    cfg = tmp_path / 'bad.py'
    cfg.write_text("_base_ = ['mmseg::_base_/models/no_such_model.py']\n")
    with pytest.raises(Exception) as theirs:
        Config.fromfile(str(cfg))
    with pytest.raises(type(theirs.value)) as ours, cached_package_lookups():
        Config.fromfile(str(cfg))
    assert 'no_such_model' in str(ours.value)
    mmseg_root = osp.dirname(__import__('mmseg').__file__)
    with cached_package_lookups():   # a name the index lacks: mmengine's ValueError (caught there)
        with pytest.raises(ValueError, match='but got nope$'):
            mm_utils._get_cfg_metainfo(mmseg_root, 'nope')
        found = mm_utils._get_cfg_metainfo(   # a config of the index is found through the cache
            mmseg_root, 'pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py')
    assert found['Config'].endswith('pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py')
