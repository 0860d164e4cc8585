# SPDX-License-Identifier: Apache-2.0
"""Exceptions raised by ringloader: one class per error code, all subclasses of :class:`Error`.

Each carries the daemon's or the client library's message, which names what was wrong
(the option, the file, the sample). Where a builtin exception means the same, the class is
also a subclass of it, so ``except ValueError`` and ``except TimeoutError`` work as expected.
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every ringloader error. ``code`` names the error code."""

    code = "error"


class Unavailable(Error, ConnectionError):
    """The daemon is unreachable and stayed so past ``reconnect_deadline``."""

    code = "unavailable"


class NotFound(Error, LookupError):
    """An unknown dataset name."""

    code = "not_found"


class InvalidArgument(Error, ValueError):
    """A bad option or state; the message names it and the rule."""

    code = "invalid_argument"


class ResourceExhausted(Error):
    """The daemon's ``memory_limit`` or another configured limit refused the request."""

    code = "resource_exhausted"


class DataLoss(Error):
    """A sample failed under ``on_error = "fail"``, a checksum mismatched, or a batch is missing."""

    code = "data_loss"


class FailedPrecondition(Error):
    """Used in a state where it cannot work: after ``fork()``, a changed dataset, a closed loader."""

    code = "failed_precondition"


class Internal(Error):
    """A broken invariant in the daemon or the client; please report it."""

    code = "internal"


class DeadlineExceeded(Error, TimeoutError):
    """No batch within the ``timeout`` asked for; the loader goes on."""

    code = "deadline_exceeded"


_BY_CODE = {
    cls.code: cls
    for cls in (Unavailable, NotFound, InvalidArgument, ResourceExhausted, DataLoss,
                FailedPrecondition, Internal, DeadlineExceeded)
}


def error_class(code: str) -> type[Error]:
    """The class for an error code name (as the C++ client's ErrorCodeName spells it)."""
    return _BY_CODE.get(code, Error)


__all__ = ["Error", "Unavailable", "NotFound", "InvalidArgument", "ResourceExhausted", "DataLoss",
           "FailedPrecondition", "Internal", "DeadlineExceeded", "error_class"]
