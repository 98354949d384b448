"""Telling a store that does not answer from a checkpoint that is damaged or a request that is refused.

An unreachable store (connection refused, reset or timed out, a name that does not resolve, HTTP 5xx) is
transient: copies retry it, and a caller reports it apart (`StoreUnreachableError`). Anything else an object
store or a disk raises while one checkpoint is read (a permission refused, a missing object, an I/O error) is
about that checkpoint: it is damage to report for that step, never a reason to retry for minutes.
"""

from __future__ import annotations

import socket


def _foreign_unreachable() -> tuple[type[BaseException], ...]:
    """The connection and timeout errors of the object-store clients that are installed."""
    found: list[type[BaseException]] = []
    try:
        from botocore import exceptions as boto
    except ImportError:
        pass
    else:
        found += [boto.ConnectionError, boto.HTTPClientError]  # refused, closed, read/connect timeouts
    try:
        import aiohttp
    except ImportError:
        pass
    else:
        found += [aiohttp.ClientConnectionError, aiohttp.ServerTimeoutError]
    return tuple(found)


def _server_error(error: BaseException) -> bool:
    """An HTTP 5xx answer, as botocore reports it (`ClientError.response`)."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return isinstance(status, int) and status >= 500


def is_unreachable(error: BaseException) -> bool:
    """Whether `error`, or any error it was raised from, says the store did not answer (see the module docstring)."""
    seen: set[int] = set()
    current: BaseException | None = error
    kinds: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, socket.gaierror, *_foreign_unreachable())
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, kinds) or _server_error(current):
            return True
        current = current.__cause__ or current.__context__
    return False
