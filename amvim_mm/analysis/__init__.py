from .flops import vim_family_flops
from .survival import token_survival

__all__ = ['vim_family_flops', 'token_survival']
