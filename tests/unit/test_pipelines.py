"""A pipeline's routes: the ensemble (one model per variant) or the BLS (one model)."""

from __future__ import annotations

import pytest

from tritonforge.pipelines import BLS_ROUTE, ENSEMBLE_ROUTE, PUBLIC_ROLES, ROUTES, Pipeline

PIPELINE = Pipeline(
    name="embed",
    task="embedding",
    ensembles={"fp32": "embed", "int8": "embed_int8"},
    bls="embed_bls",
    bls_variants=("fp32", "int8"),
    input="text",
    outputs=(),
)


def test_the_routes_are_the_public_roles() -> None:
    assert ROUTES == (ENSEMBLE_ROUTE, BLS_ROUTE) == PUBLIC_ROLES == ("ensemble", "bls")


def test_route_picks_the_model_and_bls_true_still_means_the_bls() -> None:
    assert PIPELINE.model("int8") == PIPELINE.model("int8", route="ensemble") == "embed_int8"
    assert PIPELINE.model(bls=True) == PIPELINE.model(route="bls") == "embed_bls"


def test_an_unknown_route_or_a_missing_bls_names_the_choices() -> None:
    with pytest.raises(KeyError, match="use one of"):
        PIPELINE.model(route="graph")
    without = Pipeline("p", "embedding", {"fp32": "p"}, None, (), "text", ())
    with pytest.raises(KeyError, match="no BLS model"):
        without.model(route=BLS_ROUTE)
