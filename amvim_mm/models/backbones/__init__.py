"""Registration of the backbones in mmengine's root registry, in the order the tools list
them: the Vim family, VMamba, PlainMamba, ViL. Each family lives in its own package
(``amvim_mm.models.vim``, ``.vmamba``, ``.plain_mamba``, ``.vil``); what they share is in
``amvim_mm.models.skeleton``."""
from ..vim import AMVim, LocalVim, Vim
from ..vmamba import VMamba
from ..plain_mamba import PlainMamba
from ..vil import AMViL, ViL

__all__ = ['Vim', 'AMVim', 'LocalVim', 'VMamba', 'PlainMamba', 'ViL', 'AMViL']
