"""No client value can forge a log line or reach a terminal raw (issue 41 item 4): a value
refused by validation is not logged at all, and whatever any logger writes has its control
characters (C0 with ESC, C1 with NEL and CSI, U+2028/U+2029) escaped, in text and JSON."""

from __future__ import annotations

import io
import json
import logging
import re
import sys

import pytest

from app.observability.logs import JsonFormatter, TextFormatter
from tests.api.helpers import retrieve_body

FORGED = "lad.audit: delete by admin: ok 200"
HOSTILE = (
    f"digits\n2026-12-08 01:00:00,000 INFO {FORGED}\r\x1b[31mred\x1b[0m"
    "\x85NEL\x9b2J\u2028LS\u2029PS\x00\x7f\u202eRLO"
)
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202e]")
"""What none of the written text may carry (newlines aside: they end records)."""
TEXT_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ \S+: ")


@pytest.fixture(params=["text", "json"])
def written(request):
    """What the service's own formatter writes for the lines logged meanwhile."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if request.param == "json" else TextFormatter())
    root, lad = logging.getLogger(), logging.getLogger("lad")
    old_level = lad.level
    root.addHandler(handler)
    lad.setLevel(logging.INFO)
    try:
        yield request.param, stream
    finally:
        root.removeHandler(handler)
        lad.setLevel(old_level)


def _records(fmt: str, text: str) -> list:
    """The records written, one per line: every line parses (JSON) or starts like a
    record (text); none carries a raw control character."""
    lines = text.splitlines()
    assert lines
    for line in lines:
        assert not RAW.search(line), ascii(line)
        if fmt == "text":
            assert TEXT_START.match(line), ascii(line)
    return [json.loads(line) for line in lines] if fmt == "json" else lines


@pytest.mark.parametrize("route", ["/v1/retrieve", "/v1/rerank"])
def test_a_refused_labels_value_forges_no_line(make_client, items, written, route) -> None:
    fmt, stream = written
    client = make_client()
    body = retrieve_body(items[0], method="vanilla") | {"labels": HOSTILE}
    if route == "/v1/rerank":
        body = {"query": body["query"], "documents": body["images"], "labels": HOSTILE}
    answer = client.post(route, json=body)
    assert answer.status_code == 422, answer.text
    records = _records(fmt, stream.getvalue())
    assert len(records) == 1  # the request's own line, no audit line
    assert FORGED not in stream.getvalue()
    if fmt == "json":
        (line,) = records
        assert line["logger"] == "lad.request" and line["status"] == 422
        assert "labels" not in line  # validation first: the refused value is never logged


def _hostile_record() -> logging.LogRecord:
    try:
        raise ValueError(HOSTILE)
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "lad.test", logging.ERROR, __file__, 1, "got %s", (HOSTILE,), exc_info
    )
    record.lad = {"labels": HOSTILE, HOSTILE: 1}
    return record


def test_every_formatter_escapes_message_fields_and_traceback() -> None:
    record = _hostile_record()
    line = JsonFormatter().format(record)
    assert line.splitlines() == [line] and not RAW.search(line)
    body = json.loads(line)
    assert body["message"] == f"got {HOSTILE}" and body["labels"] == HOSTILE  # same value
    assert HOSTILE in body["exception"]
    text = TextFormatter().format(_hostile_record())
    first, *trace = text.splitlines()
    assert TEXT_START.match(first) and not RAW.search(text)
    assert "\\x1b[31m" in first and "\\u2028" in first and "\\x85" in first
    assert trace and all(t.startswith("    ") for t in trace)  # no line of its own
