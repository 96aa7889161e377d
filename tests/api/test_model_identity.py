"""A model is known by its served name (LAD_SERVED_MODEL_NAME, default: a local directory's
own name), not by its path: a checkpoint copied elsewhere and served under the same name
keeps its profiles; a different model under that name is refused them (its weights hash);
profiles written before, keyed by the path, are named at start-up with what to do.

Each app loads the demo model from a directory through the settings, as `lad serve` does,
with one file store shared between them."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.torch import load_file, save_file

from app.main import create_app
from app.models.loader import DEMO_MODEL_DIR
from app.settings import Settings
from calibration_store import FileProfileStore, ProfileKey
from lad_lab.demo.world import make_items
from tests.api.helpers import calibration_body, retrieve_body

ITEM = make_items(1, n_candidates=3, seed="eval")[0]


@contextmanager
def serving(model: Path, store: Path, **settings: Any) -> Iterator[TestClient]:
    """The service of ``model`` loaded from its directory (the lifespan does it)."""
    values = {"device": "cpu", "torch_threads": 1, "store_url": str(store), **settings}
    app = create_app(Settings(_env_file=None, model=str(model), **values))
    with TestClient(app) as client:
        yield client


def served(client: TestClient) -> str:
    return client.get("/v1/models").json()["data"][0]["id"]


def retrieve(client: TestClient) -> Any:
    return client.post("/v1/retrieve", json=retrieve_body(ITEM))


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[float]]:
    """The demo checkpoint copied to .../a/ckpt, calibrated (profile "default", N = 3) in a
    file store; its retrieval's probabilities."""
    root = tmp_path_factory.mktemp("identity")
    checkpoint, store = root / "a" / "ckpt", root / "profiles"
    shutil.copytree(DEMO_MODEL_DIR, checkpoint)
    with serving(checkpoint, store) as client:
        assert served(client) == "ckpt"  # the directory's own name, not its path
        examples = make_items(5, n_candidates=3, seed="calibration")
        done = client.post("/v1/calibrate", json=calibration_body(examples))
        assert done.status_code == 200, done.text
        answer = retrieve(client)
        assert answer.status_code == 200, answer.text
        assert answer.json()["debiased"] is True
    return checkpoint, store, answer.json()["probabilities"]


def test_a_moved_checkpoint_keeps_its_profiles(calibrated: Any, tmp_path: Path) -> None:
    checkpoint, store, probabilities = calibrated
    moved = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(checkpoint, moved)
    with serving(moved, store, served_model_name="ckpt") as client:
        assert served(client) == "ckpt"
        listed = client.get("/v1/profiles").json()
        assert listed["model"] == "ckpt" and [p["name"] for p in listed["profiles"]] == ["default"]
        assert listed["profiles"][0]["entries"][0]["compatible"] is True
        answer = retrieve(client)
        assert answer.status_code == 200, answer.text
        assert answer.json()["profile"]["version"] == 1
        assert np.allclose(answer.json()["probabilities"], probabilities, atol=1e-6)
        metrics = client.get("/metrics").text
        assert 'model="ckpt"' in metrics
    same_name = tmp_path / "remounted" / "ckpt"  # another parent, the same directory name
    shutil.copytree(checkpoint, same_name)
    with serving(same_name, store) as client:
        assert retrieve(client).status_code == 200
    with serving(moved, store) as client:  # served as "renamed": another model's name
        refused = retrieve(client)
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "calibration_required"


def test_another_model_under_the_same_name_is_refused(calibrated: Any, tmp_path: Path) -> None:
    checkpoint, store, _ = calibrated
    other = tmp_path / "ckpt"
    shutil.copytree(checkpoint, other)
    weights = load_file(other / "model.safetensors")
    name = max(weights, key=lambda k: weights[k].numel())
    weights[name] = weights[name] * 1.01  # a fine-tune of the same architecture
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    with serving(other, store) as client:
        assert served(client) == "ckpt"
        refused = retrieve(client)
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "profile_mismatch" and "weights_hash" in error["message"]
        assert "config_hash" not in error["message"]  # the same configuration
        entry = client.get("/v1/profiles").json()["profiles"][0]["entries"][0]
        assert entry["compatible"] is False


def test_profiles_keyed_by_the_path_are_found_under_it(
    calibrated: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before served names, a profile was keyed by LAD_MODEL as typed and had no identity
    hashes: start-up names them and LAD_SERVED_MODEL_NAME=<that path> serves them."""
    checkpoint, store, _ = calibrated
    legacy_store = tmp_path / "legacy"
    files = FileProfileStore(store)
    current = files.get(ProfileKey(model_id="ckpt", name="default", label_scheme="digits", n=3))
    files.close()
    assert current is not None and current.weights_hash and current.config_hash
    old = current.model_copy(
        update={"model_id": str(checkpoint), "config_hash": None, "weights_hash": None}
    )
    written = FileProfileStore(legacy_store)
    written.put(old)
    written.close()
    with caplog.at_level(logging.WARNING), serving(checkpoint, legacy_store) as client:
        assert retrieve(client).json()["error"]["code"] == "calibration_required"
    assert f"LAD_SERVED_MODEL_NAME={checkpoint}" in caplog.text
    with serving(checkpoint, legacy_store, served_model_name=str(checkpoint)) as client:
        answer = retrieve(client)
        assert answer.status_code == 200, answer.text
        assert answer.json()["debiased"] is True


def test_a_served_name_has_no_spaces() -> None:
    with pytest.raises(ValueError, match="served_model_name"):
        Settings(_env_file=None, served_model_name="two words")
