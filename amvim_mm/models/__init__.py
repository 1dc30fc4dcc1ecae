from .backbones import AMVim, Vim  # noqa: F401  (registers the backbones)
