"""Schemathesis against the live OpenAPI document of a running server (bounded in time):
no 5xx, and every status, content type, body and header as the document says."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CHECKS = ",".join([
    "not_a_server_error", "status_code_conformance", "content_type_conformance",
    "response_schema_conformance", "response_headers_conformance",
])  # fmt: skip
MAX_TIME_S = int(os.environ.get("LAD_TEST_SCHEMATHESIS_S", "150"))


def _schemathesis() -> list[str]:
    exe = Path(sys.executable).with_name("schemathesis")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("schemathesis")
    if found is None:
        pytest.fail("schemathesis is not installed (it is in the dev extras)")
    return [found]


def test_schemathesis_finds_no_server_error_and_no_schema_mismatch(live_server, tmp_path):
    server = live_server()
    command = [
        *_schemathesis(), "run", f"{server.url}/openapi.json", "--checks", CHECKS,
        "--max-examples", "25", "--max-time", str(MAX_TIME_S), "--seed", "20240610",
        "--workers", "1", "--request-timeout", "30", "--report", "junit",
        "--report-dir", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=MAX_TIME_S + 240,
                          cwd=tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    generated = re.search(r"(\d+) generated, (\d+) passed", output)
    assert generated is not None, output[-3000:]
    assert int(generated.group(1)) >= 500 and generated.group(1) == generated.group(2), output
    assert "13 selected / 13 total" in output  # + feedback, refresh, rerank, models
    print(f"schemathesis: {generated.group(1)} cases, all passed")
