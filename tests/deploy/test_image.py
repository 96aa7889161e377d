"""The built image, run as docker-compose.yml runs it: read-only root, uid 10001, every
capability dropped, tmpfs for /tmp and /home/lad, a volume for the profile store.

`scripts/image` builds the CPU image with podman and runs this module with LAD_IMAGE set to
its tag (CI runs `scripts/image` as a step of its own, with CI=1, so here nothing skips:
a missing podman fails). Without LAD_IMAGE the module is skipped: the rest of the suite
does not build images. With LAD_IMAGE_RECORD the start-to-ready time and the drain's
figures are added to that record (scripts/image writes the build's figures there first).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from lad_client import LadClient
from lad_lab.bench.live import free_port
from lad_lab.demo.world import make_items
from tests.api.helpers import metric_value
from tests.deploy.conftest import dockerfile_instructions, dockerfile_uid, run, tool

IMAGE = os.environ.get("LAD_IMAGE", "")
RECORD = os.environ.get("LAD_IMAGE_RECORD", "")
ADMIN_TOKEN = "image-smoke-" + uuid.uuid4().hex
N = 4
DRAIN_WORK_S = 3.0  # of requests in flight when SIGTERM comes: inside the 20 s drain

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not IMAGE, reason="no image: scripts/image builds one and runs this"),
]


@dataclass
class Container:
    """One running container of the image, published on a loopback port."""

    podman: str
    name: str
    url: str
    started: float
    figures: dict[str, Any] = field(default_factory=dict)

    def podman_run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run([self.podman, *args], check=check, timeout=120)

    def inspect(self, template: str) -> str:
        return self.podman_run("inspect", "--format", template, self.name).stdout.strip()

    def logs(self) -> str:
        done = self.podman_run("logs", self.name, check=False)
        return done.stdout + done.stderr


def _wait_ready(box: Container, timeout_s: float = 180) -> float:
    """Seconds from `podman run` to the first 200 of /readyz."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if box.inspect("{{.State.Running}}") != "true":
            pytest.fail(f"the container exited before it was ready:\n{box.logs()[-3000:]}")
        try:
            if httpx.get(f"{box.url}/readyz", timeout=2).status_code == 200:
                return time.monotonic() - box.started
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"/readyz not 200 within {timeout_s} s:\n{box.logs()[-3000:]}")


def _record(figures: dict[str, Any]) -> None:
    if RECORD:
        path = Path(RECORD)
        data = json.loads(path.read_text()) if path.exists() else {"image": IMAGE}
        path.write_text(json.dumps({**data, **figures}, indent=2) + "\n")


@pytest.fixture(scope="module")
def box() -> Iterator[Container]:
    podman = tool("podman")
    name = f"lad-image-test-{uuid.uuid4().hex[:8]}"
    volume = f"{name}-var"
    port = free_port()
    run([podman, "volume", "create", volume])
    uid = dockerfile_uid()
    started = time.monotonic()
    # docker-compose.yml's x-lad, with the embedded store on a volume instead of Redis.
    run(
        [
            podman,
            "run",
            "--detach",
            "--name",
            name,
            "--read-only",
            "--user",
            f"{uid}:{uid}",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--tmpfs",
            "/tmp",
            "--tmpfs",
            # U: owned by the user, so writable as under Docker (podman 4.3 gives a tmpfs the
            # image directory's mode, 755, but root as owner)
            "/home/lad:U",
            "--volume",
            f"{volume}:/srv/lad/var",
            "--env",
            f"LAD_ADMIN_TOKEN={ADMIN_TOKEN}",
            "--env",
            "LAD_DRAIN_TIMEOUT_S=20",
            "--env",
            "LAD_LOG_FORMAT=json",
            "--publish",
            f"127.0.0.1:{port}:8000",
            IMAGE,
        ],
        timeout=120,
    )
    box = Container(podman, name, f"http://127.0.0.1:{port}", started)
    try:
        box.figures["start_to_ready_s"] = round(_wait_ready(box), 2)
        box.figures["load_1m_at_ready"] = round(os.getloadavg()[0], 1)  # others' work too
        yield box
    finally:
        run([podman, "rm", "--force", "--time", "0", name], check=False)
        run([podman, "volume", "rm", "--force", volume], check=False)
        _record(box.figures)
        print(json.dumps(box.figures))


def test_the_container_is_locked_down_as_compose_runs_it(box: Container) -> None:
    status = box.podman_run("exec", box.name, "cat", "/proc/1/status").stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["Uid"].split()[:2] == [str(dockerfile_uid())] * 2, fields["Uid"]
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[cap].strip(), 16) == 0, (cap, fields[cap])
    assert fields["NoNewPrivs"].strip() == "1"
    # the root is read-only; /tmp and /home/lad (tmpfs) and the store volume are not
    write = "touch {0}/.w && rm {0}/.w"
    for writable in ("/tmp", "/home/lad", "/srv/lad/var"):
        box.podman_run("exec", box.name, "sh", "-c", write.format(writable))
    denied = box.podman_run("exec", box.name, "sh", "-c", write.format("/srv/lad"), check=False)
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr, denied
    # the Dockerfile's HEALTHCHECK command passes (podman drops it from an OCI image)
    (healthcheck,) = dockerfile_instructions("HEALTHCHECK")
    box.podman_run("exec", box.name, *json.loads(healthcheck.split("CMD", 1)[1]))


def test_calibrate_retrieve_and_rerank_through_the_image(box: Container) -> None:
    with LadClient(box.url, admin_token=ADMIN_TOKEN, timeout=120) as lad:
        assert lad.models().data[0].id == "demo"
        examples = make_items(5, n_candidates=N, setting="random", seed="calibration")
        summary = lad.calibrate([(it.query, it.images, it.target) for it in examples])
        assert summary.n == N and summary.forward_passes == 5 * N
        assert [e.n for e in lad.profile("default").entries] == [N]  # on the store volume
        item = make_items(1, n_candidates=N, setting="random", seed="eval")[0]
        answer = lad.retrieve(item.query, item.images, method="agd")
        assert answer.index in range(N) and abs(sum(answer.probabilities) - 1) < 1e-4
        ranked = lad.rerank(item.query, item.images, method="agd")
        assert sorted(r.index for r in ranked.results) == list(range(N))
        scores = [r.relevance_score for r in ranked.results]
        assert scores == sorted(scores, reverse=True)


def test_sigterm_lets_the_requests_in_flight_finish_and_the_container_exit_0(
    box: Container,
) -> None:
    # perm_avg over the most images (N passes of N images each), several at once: seconds
    # of work on the demo model, running and queued when the signal comes. Past the drain
    # (LAD_DRAIN_TIMEOUT_S) the rest would be cut, so the work is sized to this machine.
    n = 12
    item = make_items(1, n_candidates=n, setting="random", seed="eval")[0]
    answers: list[Any] = []
    answered: list[float] = []

    def send() -> None:
        with LadClient(box.url, timeout=120, retries=0) as lad:
            try:
                answers.append(lad.retrieve(item.query, item.images, method="perm_avg"))
                answered.append(time.monotonic())
            except Exception as exc:  # the test reports whatever it was
                answers.append(exc)

    # as many as make DRAIN_WORK_S on this machine (1 to 5: 5 x 12 passes fit LAD_MAX_QUEUE)
    alone = time.monotonic()
    send()
    assert answered, answers
    one_s = answered.pop() - alone
    concurrent = min(5, max(1, math.ceil(DRAIN_WORK_S / one_s)))
    answers.clear()
    senders = [threading.Thread(target=send) for _ in range(concurrent)]
    sent = time.monotonic()
    for sender in senders:
        sender.start()
    deadline = sent + 60
    while (metric_value(httpx.get(f"{box.url}/metrics").text, "lad_requests_in_flight") or 0) < (
        concurrent
    ):
        assert time.monotonic() < deadline and not answers, f"not all in flight: {answers}"
        time.sleep(0.02)
    signalled = time.monotonic()
    box.podman_run("stop", "--time", "30", box.name)  # SIGTERM (STOPSIGNAL), SIGKILL at 30 s
    stopped = time.monotonic() - signalled
    for sender in senders:
        sender.join(60)
    logs = box.logs()
    why = (answers, stopped, logs[-3000:])
    assert [getattr(a, "index", a) in range(n) for a in answers] == [True] * concurrent, why
    lines = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    messages = [line.get("message", "") for line in lines]
    received = next((i for i, m in enumerate(messages) if "received SIGTERM" in m), None)
    logged = [i for i, line in enumerate(lines) if line.get("route") == "/v1/retrieve"]
    assert received is not None and logged[-1] > received, logs[-3000:]  # still running
    code = int(box.inspect("{{.State.ExitCode}}"))
    assert code == 0 and stopped < 30, (code, stopped, logs[-3000:])
    box.figures.update(
        {
            "perm_avg_12_s": round(one_s, 2),
            "sigterm_requests": concurrent,
            "sigterm_after_s": round(signalled - sent, 2),
            "sigterm_last_answer_s": round(max(answered) - sent, 2),
            "sigterm_to_exit_s": round(stopped, 2),
            "exit_code": code,
        }
    )
