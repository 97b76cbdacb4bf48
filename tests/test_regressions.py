"""Every saved minimal failing example under fixtures/regressions/, replayed as an ordinary test."""
import json
from pathlib import Path

import pytest

from quantverdict.generate.arch import Architecture
from quantverdict.cache import Cache
from quantverdict.precision import get_recipe
from quantverdict.generate.properties import (export_matches_torch, low_precision_within_format_bound,
                                quantized_layer_within_scale_bound)
from quantverdict.generate.strategies import Inputs

FILES = sorted((Path(__file__).resolve().parent.parent / "fixtures" / "regressions").glob("*.json"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_regression(path, qv_pipeline):
    document = json.loads(path.read_text())
    assert "TODO" not in document["explanation"], f"{path.name}: explain this case before committing it"
    arch = Architecture.from_json(json.dumps(document["architecture"]))
    inputs = Inputs(**document["inputs"])
    cache = Cache(qv_pipeline.cache.root)
    params = document["params"]
    check = {
        "export_matches_torch": lambda: export_matches_torch(arch, inputs, cache),
        "low_precision_within_format_bound": lambda: low_precision_within_format_bound(arch, inputs, params["precision"], cache),
        "quantized_layer_within_scale_bound": lambda: quantized_layer_within_scale_bound(
            arch, inputs, get_recipe(params["precision"]), cache),
    }[document["property"]]
    if document.get("expected") == "fails":  # a documented discrepancy outside the harness
        with pytest.raises(AssertionError):
            check()
    else:
        check()
