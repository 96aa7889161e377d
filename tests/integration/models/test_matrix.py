"""The model matrix over transformers' whole image-text-to-text mapping (lad_lab.testing.matrix).

Each model type is built and checked again and must keep its committed outcome
(lad_lab/testing/model_matrix.json, from which docs/models.md's matrix table is generated):
a served type still passes every check (spans cover exactly the image tokens, scores
normalised, an N = 3 + 5 batch equals its items alone, captured == eager to 1e-5 in float32,
its saved directory served through load_runner); a refused type is still refused at load
with the same reason. Types not built here must still fail to build or check (so that one
starting to work is noticed and recorded with ``python -m lad_lab.testing.matrix --write``).
A type another test of the session has already built (``shared_runner(model_type)``, the
same ``tiny_runner``) is checked on that build rather than built again.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from lad_lab.testing.matrix import NOT_BUILT, REFUSED, RESULTS, SERVED, image_text_types, outcome

_RESULTS = json.loads(RESULTS.read_text())
RECORD = {row["model_type"]: row for row in _RESULTS["types"]}
# The record is of one transformers release (the pinned one): its mapping and its classes are
# what the outcomes are about. At another release (CI's lowest-versions job) the matrix is not
# held to it; `python -m lad_lab.testing.matrix` builds that release's own matrix.
pytestmark = pytest.mark.skipif(
    _RESULTS["transformers"] != transformers.__version__,
    reason=f"the matrix record is of transformers {_RESULTS['transformers']}, "
    f"this is {transformers.__version__}",
)


def test_the_record_covers_the_whole_mapping() -> None:
    assert set(RECORD) == set(image_text_types())


@pytest.mark.slow
@pytest.mark.parametrize("model_type", image_text_types())
def test_each_type_keeps_its_outcome(model_type: str, shared_runner) -> None:
    torch.set_num_threads(1)
    committed = RECORD[model_type]
    now = outcome(model_type, runner=shared_runner.built(model_type))  # another test's build
    assert now["status"] == committed["status"], now.get("reason")
    if now["status"] == SERVED:
        assert now["tested"] == committed["tested"]
        assert now["adapter"] == committed["adapter"]
    elif now["status"] == REFUSED:
        assert now["reason"] == committed["reason"]
    else:
        assert now["status"] == NOT_BUILT
