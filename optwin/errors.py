"""The project's exceptions: every user-facing failure is one of these, with a one-line message.

The CLI catches `OptwinError` and prints `error: <message>` with a non-zero exit, never a traceback.
"""


class OptwinError(Exception):
    """Base of every error optwin raises on purpose."""


class CatalogError(OptwinError, ValueError):
    """Unknown operator, variant, dtype or param."""


class InputError(OptwinError, ValueError):
    """A tensor input has the wrong name, shape, dtype or holds forbidden values."""


class SketchError(OptwinError, ValueError):
    """A sketch is malformed: missing features, NaN where a number is required, wrong types."""


class ProfileError(OptwinError):
    """A profile directory or sketch log is missing, truncated or corrupt."""


class DatabaseError(OptwinError):
    """The fingerprint database is missing, corrupt, locked or of another schema version."""


class SchemaVersionError(DatabaseError):
    """The database's schema version is not the one this code reads: run `optwin migrate`."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message, for the one-line errors above; the exception's type name when the
    message is empty (a bare OSError(), a driver error with no text)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
