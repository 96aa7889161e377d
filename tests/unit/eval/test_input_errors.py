"""Inputs with mistakes end in one line naming the file, the item and what to change (exit
2), never a traceback: ``lad eval`` on a jsonl / COCO set written wrong, checked before any
model is loaded (every case is a --dry-run, and the loader is made to fail)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lad_lab.eval import cli
from tests.unit.eval.fixtures import write_coco, write_jsonl


@pytest.fixture(autouse=True)
def _no_model(monkeypatch) -> None:
    import app.models.loader as loader

    monkeypatch.setattr(loader, "load_runner", lambda *a, **k: pytest.fail("model loaded"))


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _eval(capsys, *argv: str) -> str:
    code = cli.main(["--dry-run", "--quiet", "-n", "4", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def _jsonl(capsys, tmp_path: Path, path: Path, items: int = 3, calibration: int = 2) -> str:
    return _eval(
        capsys,
        "--dataset",
        "jsonl",
        "--data",
        str(path),
        "--items",
        str(items),
        "--calibration",
        str(calibration),
        "--out",
        str(tmp_path / "out"),
    )


def test_a_repeated_item_names_both_lines(tmp_path, capsys) -> None:
    path = write_jsonl(tmp_path, count=6)
    rows = _lines(path)
    rows.insert(4, dict(rows[1], id="again"))
    err = _jsonl(capsys, tmp_path, _write(path, rows))
    assert f"{path}:5: item again" in err and "as line 2" in err and "remove one" in err


def test_a_missing_image_names_the_item_and_the_path(tmp_path, capsys) -> None:
    path = write_jsonl(tmp_path, count=6)
    rows = _lines(path)
    rows[2]["images"][1] = "imgs/nowhere.png"
    err = _jsonl(capsys, tmp_path, _write(path, rows))
    assert f"{path}:3: item q2" in err and "nowhere.png not found" in err


@pytest.mark.parametrize(
    ("answer", "said"),
    [("2", "must be the 0-based index"), (1.5, "must be the 0-based index"), (True, "got True")],
)
def test_a_bad_answer_field_says_what_it_must_be(tmp_path, capsys, answer, said) -> None:
    path = write_jsonl(tmp_path, count=6)
    rows = _lines(path)
    rows[0]["answer"] = answer
    err = _jsonl(capsys, tmp_path, _write(path, rows))
    assert f"{path}:1: item q0" in err and said in err


def test_an_answer_outside_the_images_gives_the_range(tmp_path, capsys) -> None:
    path = write_jsonl(tmp_path, count=6)
    rows = _lines(path)
    rows[3]["answer"] = 4
    err = _jsonl(capsys, tmp_path, _write(path, rows))
    assert f"{path}:4: item q3" in err and "use 0..3 (0-based)" in err


def test_not_json_and_missing_fields(tmp_path, capsys) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"query": "x", "images": ["a.png"]}\n')
    assert f"{path}:1: no answer" in _jsonl(capsys, tmp_path, path)
    path.write_text("{oops\n")
    assert f"{path}:1: not a JSON object" in _jsonl(capsys, tmp_path, path)
    missing = tmp_path / "none.jsonl"
    assert f"{missing}: no such file" in _jsonl(capsys, tmp_path, missing)


def test_too_few_calibration_items_say_why(tmp_path, capsys) -> None:
    path = write_jsonl(tmp_path, count=6)
    err = _jsonl(capsys, tmp_path, path, items=5, calibration=3)
    assert "only 1 of the --calibration 3 items" in err and "lower --items" in err


def _coco(capsys, tmp_path: Path, captions: Path, images: Path) -> str:
    return _eval(
        capsys,
        "--dataset",
        "coco",
        "--data",
        str(captions),
        "--images",
        str(images),
        "--items",
        "3",
        "--calibration",
        "2",
        "--out",
        str(tmp_path / "out"),
    )


def test_coco_mistakes(tmp_path, capsys) -> None:
    captions, images, _ = write_coco(tmp_path / "coco", count=12)
    assert "no such folder" in _coco(capsys, tmp_path, captions, tmp_path / "nowhere")
    doc = json.loads(captions.read_text())
    (images / doc["images"][0]["file_name"]).unlink()
    err = _coco(capsys, tmp_path, captions, images)
    assert err.startswith(f"lad eval: {captions}: item coco/") and "im000.png not found" in err
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"annotations": [{"image_id": 1}]}))
    err = _coco(capsys, tmp_path, broken, images)
    assert "annotation 0 lacks image_id or caption" in err
    broken.write_text("[1, 2")
    assert f"{broken}: not JSON" in _coco(capsys, tmp_path, broken, images)
