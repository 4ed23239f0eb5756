"""Logging, set up once by the CLI group: text or one JSON object per line, secrets redacted.

Tokens should never reach a log in the first place (settings keep them out of reprs, errors cut
response bodies short); the `RedactSecrets` filter is the belt to those braces: it rewrites
`Authorization: ...`, `Bearer ...`, `hf_...` token shapes, tracker passkeys (`/announce/<passkey>`) and
the query string of a signed URL (a CDN's `?X-Amz-Signature=...`, which urllib3 logs at DEBUG with each
request) in every record that is emitted, whatever module produced it (uvicorn, httpx, libraries).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

from agent.core.progress import on_terminal

LOG_FORMATS = ("text", "json")
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_SECRET_PATTERNS = (
    (
        re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)(?:bearer\s+|basic\s+|token\s+)?[^\s'\",}]+"),
        r"\1[REDACTED]",
    ),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+"), r"\1[REDACTED]"),
    (re.compile(r"\bhf_[A-Za-z0-9]{8,}\b"), "hf_[REDACTED]"),
    # The tracker's passkey is a path segment of every announce URL, which httpx logs at INFO with
    # each request (the relay's announces: agent.relay.directory), and the chart's default level is INFO.
    (re.compile(r"(/(?:announce|scrape)/)[A-Za-z0-9._~-]+"), r"\1[REDACTED]"),
)


_QUERY = re.compile(r"\?[^\s\"'<>]+")
_SIGNED = re.compile(
    r"(?i)(?:^|[?&])(?:[\w-]*signature|x-amz-|x-goog-|sig=|key-pair-id|policy=|token=|[\w-]*credential)"
)
"""Query parameters of signed URLs: S3 / the Hub's CDN (X-Amz-*), GCS (X-Goog-*), Azure SAS (sig),
CloudFront (Signature, Policy, Key-Pair-Id), and tokens. The whole query goes: its other parameters
(expiry, key id) are no use without the signature. Other queries (`?info_hash=`) stay readable."""


def _redact_query(match: re.Match[str]) -> str:
    return "?[REDACTED]" if _SIGNED.search(match.group(0)) else match.group(0)


def redact(text: str) -> str:
    for pattern, repl in _SECRET_PATTERNS:
        text = pattern.sub(repl, text)
    return _QUERY.sub(_redact_query, text)


class RedactSecrets(logging.Filter):
    """Formats the message once, redacted, so no argument can smuggle a token past the formatter."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to logging's own error report
            return True
        cleaned = redact(message)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        record.msg, record.args = cleaned, None
        return True


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Text lines to stderr; while a progress block is drawn there (agent.core.progress `on_terminal`), a
    line goes above it as `level: message`, wrapped to the terminal's width, and the block is redrawn
    under it. A timestamp says nothing the block does not; without a block each line is as formatted."""

    def emit(self, record: logging.LogRecord) -> None:
        shown = on_terminal()
        if shown is None or shown.stream is not self.stream or record.exc_info:
            return super().emit(record)
        try:
            shown.message(f"{record.levelname.lower()}: {record.getMessage()}")
        except Exception:  # noqa: BLE001 - logging's own error report, as StreamHandler does
            self.handleError(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (RFC 3339 UTC), level, logger, msg, and exc when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = redact(record.exc_text)
        return json.dumps(out, ensure_ascii=False)


def setup_logging(level: str = "WARNING", fmt: str = "text") -> None:
    """Replace the root logger's handlers with one stderr handler in the chosen format."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr) if fmt == "json" else _Stderr(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT_FORMAT))
    handler.addFilter(RedactSecrets())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # httpx tells each request at INFO with its URL, and a tracker URL names the model
    # (`/v1/manifests/org/name/...`), which INFO lines name as metrics do (agent.core.modelnames): its
    # lines are the operator's opt-in, at DEBUG.
    logging.getLogger("httpx").setLevel(logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING)
