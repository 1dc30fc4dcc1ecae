"""One registry: our types are found from the mmseg, mmdet and mmpretrain scopes."""
import pytest
from mmengine.config import Config
from mmengine.registry import DefaultScope

import amvim_mm  # noqa: F401
from amvim_mm.models.skeleton.base import MambaBackbone
from amvim_mm.registry import MODELS as ROOT_MODELS

#: our backbones, from the registry (a new one is covered by registering it)
BACKBONES = sorted(n for n, c in ROOT_MODELS.module_dict.items()
                   if isinstance(c, type) and issubclass(c, MambaBackbone))


def test_every_backbone_is_found():
    assert {'Vim', 'AMVim', 'LocalVim', 'VMamba', 'PlainMamba'} <= set(BACKBONES)


@pytest.mark.parametrize('scope', ['mmseg', 'mmdet', 'mmpretrain'])
@pytest.mark.parametrize('name', BACKBONES)
def test_type_found_from_each_scope(scope, name):
    import importlib
    registry = importlib.import_module(f'{scope}.registry').MODELS
    assert registry.scope == scope
    cls = registry.get(name)
    assert cls is ROOT_MODELS.get(name)
    model = registry.build(dict(type=name, arch='test', img_size=32))
    assert type(model).__name__ == name


def test_custom_imports_in_config(tmp_path):
    cfg_file = tmp_path / 'cfg.py'
    cfg_file.write_text(
        "custom_imports = dict(imports=['amvim_mm'], allow_failed_imports=False)\n"
        "default_scope = 'mmseg'\n"
        "model = dict(type='Vim', arch='test', img_size=32, out_type='featmap')\n")
    cfg = Config.fromfile(str(cfg_file))
    from mmseg.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmseg'):
        m = MODELS.build(cfg.model)
    assert type(m).__name__ == 'Vim'


def test_unknown_type_error_names_it():
    from mmseg.registry import MODELS
    with pytest.raises(KeyError, match='Vimm is not in the'):
        MODELS.build(dict(type='Vimm'))
