"""The spec's error body (section 7), raised anywhere in the sandbox and rendered once."""

from __future__ import annotations


class ODataError(Exception):
    """A request the sandbox refuses: HTTP status plus the spec's `error.code/message/details`."""

    def __init__(self, status: int, code: str, message: str, details: str = "") -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details

    def body(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


def invalid_filter(message: str, details: str = "") -> ODataError:
    return ODataError(400, "InvalidFilter", message, details)


def invalid_query(message: str, details: str = "") -> ODataError:
    return ODataError(400, "InvalidQueryOption", message, details)


def not_found(message: str, details: str = "") -> ODataError:
    return ODataError(404, "NotFound", message, details)
