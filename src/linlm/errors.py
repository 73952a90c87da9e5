"""One family of exceptions for mistakes a user can fix.

Every message says what was wrong, where (file, key, line) and what to do. The CLI prints these
without a traceback and exits with status 2; any other exception is a bug (exit 1, traceback).
"""

from __future__ import annotations


class LinlmError(Exception):
    """Base class for user-facing errors."""


class ConfigError(LinlmError, ValueError):
    """An unknown key, a wrong type, or an impossible value in a config or an override."""


class ShapeError(LinlmError, ValueError):
    """Inputs whose shapes or values do not fit the model (too long, ids out of range, ...)."""


class CheckpointError(LinlmError):
    """A checkpoint that is missing, truncated, corrupt, or does not match the model."""


class DataError(LinlmError):
    """A data source that is empty, unreadable, or missing a field."""


class TokenizerError(LinlmError):
    """A tokenizer that cannot be loaded or does not fit the model."""


class StorageError(LinlmError):
    """A file linlm must write could not be written: disk full, read-only, no permission, a path under a file."""


class ResourceError(LinlmError):
    """A request that needs more memory than the machine has (linlm.resources): the estimate and what is available
    are named, and nothing was started."""


class LockedError(LinlmError):
    """A run directory or prepared-data directory that another live process holds (its message names the PID)."""


class TrainingDiverged(LinlmError):
    """Training stopped: too many non-finite steps in a row, or an update that blew up the weights."""


class OutputError(ConfigError):
    """A path linlm was asked to write that is not linlm's: a user's file, a directory holding a user's files, a
    symbolic link (linlm.outputs). The message names the path and what to do; nothing was changed."""

def choices_text(choices) -> str:
    """Format valid choices for an error message."""
    return ", ".join(repr(c) for c in sorted(choices))

