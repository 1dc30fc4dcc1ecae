"""The project's error types: problems a user can fix, reported by the tools in one line.

Every error a user can cause through a config, a flag, a checkpoint or the environment is one of
these. The tools (``tools/*.py``) catch :class:`AmvimError` and print ``error: <message>`` with a
non-zero exit instead of a traceback; anything else is a bug and keeps its traceback.

Each type also derives from the builtin exception that code outside the project would expect
(``ValueError``/``TypeError`` for a bad value, ``RuntimeError`` for a failed load), so existing
``except ValueError`` clauses keep working. mmengine's registry re-raises a build error as
``type(e)(message)``, so every type here takes one message argument.
"""
from __future__ import annotations

import pickle


class AmvimError(Exception):
    """Base of the errors a user can fix (bad config value, checkpoint, environment)."""


class ConfigError(AmvimError, ValueError, TypeError):
    """A config value, argument or input that the project cannot use."""


class LookupConfigError(ConfigError, KeyError):
    """An unknown name (arch, reducer type, model); a ``KeyError`` for existing callers."""

    def __str__(self) -> str:   # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ''


class BackendUnavailableError(AmvimError, RuntimeError):
    """A kernel or device that was asked for is not usable on this machine."""


class CheckpointError(AmvimError, RuntimeError):
    """A checkpoint that cannot be used: unreadable, truncated, corrupt or non-finite."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint's keys or shapes do not match the model."""


class UnsafeCheckpointError(CheckpointError, pickle.UnpicklingError):
    """A checkpoint that would need full unpickling (which can run code) without the opt-in."""


def first_line(err: BaseException, limit: int = 200) -> str:
    """The first line of an error's message (its type's name when empty), at most ``limit``
    characters: how a library's long or multi-line error enters our one-line messages."""
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:limit]
