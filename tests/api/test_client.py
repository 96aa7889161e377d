"""The Python client against a real app (tiny model, memory store)."""

import pytest

from app.client import LadClient, LadError


def test_client_calibrates_retrieves_and_manages_profiles(make_client, items, calibration_items):
    http = make_client(admin_token="admin-secret")
    lad = LadClient(http=http, admin_token="admin-secret")

    with pytest.raises(LadError) as missing:
        lad.retrieve(items[0].query, items[0].images)
    assert missing.value.status == 409 and missing.value.code == "calibration_required"

    summary = lad.calibrate([(it.query, it.images, it.target) for it in calibration_items])
    assert summary["version"] == 1 and summary["n"] == 3

    answer = lad.retrieve(items[0].query, items[0].images, return_details=True)
    assert 0 <= answer["index"] < 3
    assert abs(sum(answer["probabilities"]) - 1) < 1e-6
    assert answer["profile"] == {"name": "default", "version": 1}

    lad.calibrate([(it.query, it.images, it.target) for it in calibration_items])
    assert lad.rollback("default", 3)["version"] == 1
    assert "default" in str(lad.profiles())
    lad.delete("default", 3)
    with pytest.raises(LadError):
        lad.retrieve(items[0].query, items[0].images)


def test_client_without_admin_token_is_refused(make_client, calibration_items):
    http = make_client(admin_token="admin-secret")
    lad = LadClient(http=http)
    with pytest.raises(LadError) as refused:
        lad.calibrate([(it.query, it.images, it.target) for it in calibration_items])
    assert refused.value.status == 401
