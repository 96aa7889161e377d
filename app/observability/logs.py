"""Logs an operator can follow: one line per request, audit lines, JSON or text.

Each HTTP request gets a ``RequestRecord`` (set by the request middleware of
``request_metrics``); the layers below fill in what they learn while handling it (``note``:
the retrieval method, N, the profile and its version, which token was accepted). When the
request ends the middleware writes ONE line for it on the ``lad.request`` logger, and an
``lad.audit`` line for each admin action that changes a profile (calibrate, rollback,
delete, refresh: the route table's ``audit``). Every other line logged while a
request runs carries its request id, so a request can be followed through the log.

``LAD_LOG_FORMAT=json`` writes one JSON object per line (for log collectors); ``text``
writes ``time level logger: message key=value ...`` for people.

No value can forge a line or drive a terminal, whoever logs it: both formatters escape every
control character (C0 with ESC, DEL, C1 with NEL U+0085 and CSI U+009B), the line and
paragraph separators U+2028/U+2029 and the bidirectional overrides, in the message, every
field and the traceback, so ``str.splitlines()`` of what one record wrote gives one line
(text: a traceback's own lines follow indented, never as a line of their own).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from app.errors import ECHO_CHARS, clip
from lad_client.routes import ROUTES

LogFormat = Literal["json", "text"]

request_log = logging.getLogger("lad.request")
audit_log = logging.getLogger("lad.audit")
warnings_log = logging.getLogger("lad.warnings")

AUDITED: dict[tuple[str, str], str] = {
    (route.method, route.path): route.audit for route in ROUTES if route.audit is not None
}
"""(HTTP verb, route template) -> the audited admin action (the route table's ``audit``)."""


@dataclass
class RequestRecord:
    """What one request did, filled in as it is handled; written as its log line."""

    request_id: str | None = None
    route: str = ""
    http_method: str = ""
    status: int = 0
    latency_ms: float = 0.0
    error_code: str | None = None
    token: str | None = None  # which bearer token was accepted: admin, retrieve, or open
    method: str | None = None  # the retrieval method that answered
    requested_method: str | None = None
    fallback: bool = False
    n: int | None = None
    profile: str | None = None
    labels: str | None = None
    version: int | None = None
    previous_version: int | None = None
    ignored_fields: str | None = None  # rerank: the fields sent that change nothing, escaped

    def fields(self) -> dict[str, Any]:
        """The set fields (None and the unused fallback flag left out)."""
        out = {k: v for k, v in asdict(self).items() if v is not None}
        if not self.fallback:
            out.pop("fallback")
        return out


_CURRENT: ContextVar[RequestRecord | None] = ContextVar("lad_request_record", default=None)


def current() -> RequestRecord | None:
    """The record of the request being handled here (None outside a request)."""
    return _CURRENT.get()


def note(**fields: Any) -> None:
    """Add facts to the current request's record; nothing happens outside a request."""
    record = _CURRENT.get()
    if record is None:
        return
    for name, value in fields.items():
        if not hasattr(record, name):
            raise AttributeError(f"RequestRecord has no field {name!r}")
        setattr(record, name, value)


MAX_NAMED = 16
"""Most client-chosen names (ignored fields) one log line lists; the rest are counted."""


def escaped_names(names: Sequence[str], most: int = MAX_NAMED) -> str:
    """Names a client chose, for a log line: each as a quoted ASCII literal (control,
    non-ASCII and bidirectional characters escaped, so a name can neither forge a line nor
    read otherwise than it is) cut to 64 characters, at most ``most`` of them."""
    shown = ", ".join(ascii(clip(name, 64)) for name in names[:most])
    more = len(names) - most
    return shown + (f" (and {more} more)" if more > 0 else "")


@contextmanager
def request_scope(record: RequestRecord) -> Iterator[RequestRecord]:
    """Make ``record`` the current one for the code (and the threads it starts) inside."""
    token = _CURRENT.set(record)
    try:
        yield record
    finally:
        _CURRENT.reset(token)


def log_request(record: RequestRecord, *, probe: bool = False) -> None:
    """The one line of a finished request, and its audit line for an admin action.

    A ``probe`` (scrape, liveness or readiness probe) that succeeded is logged at debug
    level only: probes come every few seconds from every orchestrator and scraper."""
    fields = record.fields()
    level = logging.ERROR if record.status >= 500 else logging.INFO
    if probe and record.status < 400:
        level = logging.DEBUG
    request_log.log(
        level,
        "%s %s %d %.1f ms",
        clip(record.http_method, ECHO_CHARS),
        record.route,
        record.status,
        record.latency_ms,
        extra={"lad": fields},
    )
    action = AUDITED.get((record.http_method, record.route))
    if action is not None:
        audit = {"action": action, "by": record.token or "unauthenticated", **fields}
        audit_log.info(
            "%s by %s: %s %s",
            action,
            audit["by"],
            "ok" if record.status < 400 else "refused",
            record.status,
            extra={"lad": audit},
        )


# ------------------------------------------------------------------------ formatting
class _RequestIdFilter(logging.Filter):
    """Stamp every line logged while a request runs with its id."""

    def filter(self, record: logging.LogRecord) -> bool:
        current_record = _CURRENT.get()
        if current_record is not None and current_record.request_id:
            record.request_id = current_record.request_id
        return True


MAX_LOG_MESSAGE_CHARS = 8000
"""Most characters of a line's message; a longer one keeps its head and its tail (a
traceback's last line says what failed) around an ellipsis."""
MAX_LOG_EXCEPTION_CHARS = 8000
"""Most characters of a traceback written with a line (debug level only)."""
MAX_LOG_LINE_BYTES = 32 * 1024
"""Most bytes of one log line: a request whose method, path or fields are 60 KB adds at
most this much to the log."""
MAX_LOG_FIELDS = 64
"""Most key=value fields of one line (ours have about fifteen)."""


_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""What a log line never carries raw: C0 (newlines, ESC of ANSI sequences), DEL, C1 (NEL,
CSI), the Unicode line and paragraph separators and the bidirectional controls."""
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""The part of ``_UNSAFE`` that ``json.dumps(ensure_ascii=False)`` leaves raw (it escapes C0)."""


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every character of ``_UNSAFE`` written as its escape (``\\x1b``,
    ``\\u2028``): what a text log line carries of any value."""
    return _UNSAFE.sub(_escape_char, text)


def _json_escape(line: str) -> str:
    """A JSON line with the characters json leaves raw written as ``\\uXXXX`` (they occur
    only inside strings, so the line stays the same JSON)."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", line)


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    """The record's fields, each string cut to ``ECHO_CHARS`` (they echo client values:
    the HTTP method, a profile name, the labels)."""
    fields = dict(list((getattr(record, "lad", None) or {}).items())[:MAX_LOG_FIELDS])
    request_id = getattr(record, "request_id", None)
    if request_id and "request_id" not in fields:
        fields["request_id"] = request_id
    return {
        clip(k, ECHO_CHARS): clip(v, ECHO_CHARS) if isinstance(v, str) else v
        for k, v in fields.items()
    }


def _clip_middle(text: str, limit: int = MAX_LOG_MESSAGE_CHARS) -> str:
    """``text`` within ``limit`` characters: its head and its tail around an ellipsis."""
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return f"{text[:half]} … {text[len(text) - half :]}"


def _bounded(line: str, cut: str) -> str:
    """``line`` within MAX_LOG_LINE_BYTES; past it, ``cut`` (a shorter line saying so)."""
    return line if len(line.encode("utf-8", "replace")) <= MAX_LOG_LINE_BYTES else cut


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, then the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        head: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        message = _clip_middle(record.getMessage())
        body = {**head, "message": message, **_extra(record)}
        if record.exc_info:
            body["exception"] = _clip_middle(
                self.formatException(record.exc_info), MAX_LOG_EXCEPTION_CHARS
            )
        line = _json_escape(json.dumps(body, default=str, ensure_ascii=False))
        short = {**head, "message": _clip_middle(message, 2000), "cut_bytes": len(line)}
        return _bounded(line, _json_escape(json.dumps(short, default=str, ensure_ascii=False)))


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value ...`` for a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(_clip_middle(record.getMessage()))
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        extra = " ".join(
            f"{escape_controls(k)}={escape_controls(v) if isinstance(v, str) else v}"
            for k, v in _extra(record).items()
        )
        line = f"{line} {extra}" if extra else line
        if record.exc_info:  # each of its lines escaped and indented: none reads as a record
            trace = _clip_middle(self.formatException(record.exc_info), MAX_LOG_EXCEPTION_CHARS)
            line += "".join(f"\n    {escape_controls(t)}" for t in trace.splitlines())
        return _bounded(line, _clip_middle(line, MAX_LOG_LINE_BYTES // 4))


def configure_logging(level: str = "info", fmt: LogFormat = "text") -> None:
    """Route every logger (ours, uvicorn's, the libraries') and every library warning
    (rate-limited: ``route_warnings``) through one stderr handler.

    Uvicorn's access log is not used: ``lad.request`` writes the request lines (for
    /metrics, /healthz and /readyz only when they fail, or at debug level). Library
    progress bars are turned off elsewhere (app.models).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.getLogger("uvicorn.access").disabled = True
    route_warnings()


# ------------------------------------------------------------------------ library warnings
WARNING_INTERVAL_S = 60.0
"""Each place that warns writes at most one line per interval; the next says how many
were left out."""


class WarningLimiter:
    """``warnings.showwarning`` for the service: library warnings become lines of the
    ``lad.warnings`` logger (so JSON when the logs are JSON), at most one per interval per
    place in the code that warns, whatever the message says: one PNG made Pillow warn
    30,000 times, each message naming another EXIF tag."""

    def __init__(self, interval_s: float = WARNING_INTERVAL_S, max_places: int = 1024) -> None:
        self.interval_s = interval_s
        self.max_places = max_places
        self._last: dict[tuple[str, str, int], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def __call__(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        place = (category.__name__, filename, lineno)
        now = time.monotonic()
        with self._lock:
            last, left_out = self._last.get(place, (-self.interval_s, 0))
            if now - last < self.interval_s:
                self._last[place] = (last, left_out + 1)
                return
            if len(self._last) >= self.max_places:
                self._last.clear()
            self._last[place] = (now, 0)
        fields = {"category": category.__name__, "source": f"{filename}:{lineno}"}
        if left_out:
            fields["left_out"] = left_out
        warnings_log.warning("%s", str(message).replace("\n", " ")[:500], extra={"lad": fields})


def route_warnings(interval_s: float = WARNING_INTERVAL_S) -> None:
    """Send every library warning through ``WarningLimiter``. Pillow's warnings are shown
    every time ("always") so that Python's per-message registry (one entry per distinct
    text, kept forever) does not grow; the limiter does the deduplication instead."""
    warnings.filterwarnings("always", module=r"PIL(\.|$)")
    warnings.showwarning = WarningLimiter(interval_s)
