from .backbones import AMVim, LocalVim, Vim  # noqa: F401  (registers the backbones)
