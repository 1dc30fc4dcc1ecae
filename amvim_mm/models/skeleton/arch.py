"""The one rule every backbone resolves its ``arch`` by (mmpretrain's ``arch_zoo`` pattern).

``arch`` is a zoo name or one of its aliases (case-insensitive; an entry's ``aliases``, default
its key), or a custom dict with the family's required keys and any of its optional ones. A
family then validates the values it takes (positive ints, odd kernels, ...) itself.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, Optional, Union

from amvim_mm.errors import ConfigError, LookupConfigError

__all__ = ['resolve_arch']


def resolve_arch(family: str, zoo: Dict[str, dict], arch: Union[str, dict],
                 required: FrozenSet[str], defaults: dict,
                 zoo_defaults: Optional[dict] = None) -> Dict[str, object]:
    """The settings of ``arch`` for ``family`` (its name in messages).

    Args:
        zoo: name -> settings (an optional ``aliases`` tuple among them).
        required: the keys a custom dict must give.
        defaults: the optional keys of a custom dict with their defaults (a key outside
            ``required`` and ``defaults`` is refused).
        zoo_defaults: what a zoo entry is completed with (default ``defaults``).

    Raises:
        LookupConfigError: an unknown name (naming the choices).
        ConfigError: neither a name nor a dict, or a dict with missing or unknown keys.
    """
    if isinstance(arch, str):
        aliases = {a.lower(): key for key, cfg in zoo.items()
                   for a in cfg.get('aliases', (key, ))}
        key = aliases.get(arch.lower())
        if key is None:
            raise LookupConfigError(f'unknown {family} arch {arch!r}; choose one of '
                                    f'{sorted(aliases)} or pass a dict with the keys '
                                    f'{sorted(required)}')
        cfg = dict(defaults if zoo_defaults is None else zoo_defaults)
        cfg.update((k, v) for k, v in zoo[key].items() if k != 'aliases')
        return cfg
    if not isinstance(arch, dict):
        raise ConfigError(f'{family} arch must be a name or a dict, got {type(arch).__name__}')
    missing = required - set(arch)
    unknown = set(arch) - required - set(defaults)
    if missing or unknown:
        raise ConfigError(
            f'custom {family} arch {arch!r}: '
            + (f'missing keys {sorted(missing)}; ' if missing else '')
            + (f'unknown keys {sorted(unknown)}; ' if unknown else '')
            + f'required {sorted(required)}, optional {sorted(defaults)}')
    cfg = dict(defaults)
    cfg.update(arch)
    return cfg
