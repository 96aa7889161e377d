"""Schemathesis against the live OpenAPI document of a running server: no 5xx, and every
status, content type, body and header as the document says.

Bounded by example count, not by time: without --max-time every phase runs to completion
(examples, the whole coverage phase, --max-examples fuzzing cases per operation, stateful)
and the run ends when its cases are done. With --max-time the engine splits the budget into
per-phase shares, cuts the coverage phase off at its share and repeats fuzzing and stateful
until the clock runs out, so it always spent the whole budget, and how much of the schema it
covered depended on the machine's speed. The timeout is only a guard against a hung server."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from lad_client.routes import ROUTES

pytestmark = pytest.mark.slow

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
    ]
)
MAX_EXAMPLES = int(os.environ.get("LAD_TEST_SCHEMATHESIS_EXAMPLES", "25"))
ALIASES = tuple(route.path for route in ROUTES if route.alias_of is not None)
"""Not fuzzed again: the handler and schema of their route (tests/api/test_route_table.py)."""
OPERATIONS = len(ROUTES) - len(ALIASES)
HANG_GUARD_S = 900


def _schemathesis() -> list[str]:
    exe = Path(sys.executable).with_name("schemathesis")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("schemathesis")
    if found is None:
        pytest.fail("schemathesis is not installed (it is in the dev extras)")
    return [found]


def _operations_run(report_dir: Path) -> set[str]:
    """The operations ("POST /v1/retrieve") the junit report has test cases for."""
    names: set[str] = set()
    for report in report_dir.glob("*.xml"):
        names |= {case.get("name", "") for case in ElementTree.parse(report).iter("testcase")}
    return {name for name in names if re.match(r"(GET|POST|PUT|PATCH|DELETE) /", name)}


def test_schemathesis_finds_no_server_error_and_no_schema_mismatch(live_server, tmp_path):
    server = live_server()
    command = [
        *_schemathesis(),
        "run",
        f"{server.url}/openapi.json",
        "--checks",
        CHECKS,
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        "20240610",
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
        *(arg for path in ALIASES for arg in ("--exclude-path", path)),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=tmp_path
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    generated = re.search(r"(\d+) generated, (\d+) passed", output)
    assert generated is not None, output[-3000:]
    assert int(generated.group(1)) >= 500 and generated.group(1) == generated.group(2), output
    assert f"{OPERATIONS} selected / {len(ROUTES)} total" in output
    assert len(_operations_run(tmp_path)) == OPERATIONS, output[-3000:]
    print(f"schemathesis: {generated.group(1)} cases, all passed")
