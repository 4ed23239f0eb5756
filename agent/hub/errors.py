"""The test hub's refusals: the Hub's (a JSON body, X-Error-Code / X-Error-Message), its CDN's (S3 XML)."""

from __future__ import annotations

import time
from xml.sax.saxutils import escape


class HttpError(Exception):
    """A refusal as the Hub sends it: a JSON `{"error": message}` body and the X-Error-* headers."""

    def __init__(
        self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}


class CdnBlocked(HttpError):
    """A refusal by the CDN in front of the bucket (not by S3): CloudFront's HTML error page, `X-Cache: Error
    from cloudfront`; the body names no expired URL or signature (`S3Error`'s do)."""

    content_type = "text/html"

    def __init__(self, status: int) -> None:
        reason = {403: "Request blocked", 429: "Too many requests"}.get(status, "Request blocked")
        super().__init__(status, reason, None, {"X-Cache": "Error from cloudfront"})

    def body(self, request_id: str) -> bytes:
        return (
            "<!DOCTYPE HTML><HTML><HEAD><TITLE>ERROR: The request could not be satisfied</TITLE></HEAD>"
            f"<BODY><H1>{self.status} ERROR</H1><H2>The request could not be satisfied.</H2>{self.message}."
            f"<BR>Request ID: {escape(request_id)}</BODY></HTML>"
        ).encode()


class S3Error(HttpError):
    """A refusal as an S3 bucket behind CloudFront sends it: an XML `<Error>` body, no X-Error-* headers.

    The expired form (`AccessDenied` / `Request has expired` with `X-Amz-Expires`, `Expires`,
    `ServerTime`) is what presigned URLs answer once their time is up (e.g. bnb-chain/node-binary#317,
    expo/xde#128)."""

    content_type = "application/xml"

    def __init__(self, status: int, code: str, message: str, fields: dict[str, str] | None = None):
        super().__init__(status, message, code)
        self.fields = fields or {}

    def body(self, request_id: str) -> bytes:
        extra = "".join(f"<{k}>{escape(v)}</{k}>" for k, v in self.fields.items())
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{escape(self.code or '')}</Code><Message>{escape(self.message)}</Message>{extra}"
            f"<RequestId>{request_id[:16].upper()}</RequestId><HostId>{request_id}</HostId></Error>"
        ).encode()


def amz_time(epoch: float) -> str:
    """`2026-01-09T12:53:56Z`, as S3 error bodies write times."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
