"""The client's route table is the wire only; the server's limits live in the server."""

from __future__ import annotations

import dataclasses

from app.api.route_table import BODY_LIMITS, ROUTES
from app.settings import Settings
from lad_client import routes as wire


def test_the_wire_table_names_no_server_setting() -> None:
    names = {field.name for field in dataclasses.fields(wire.Route)}
    assert not {n for n in names if "limit" in n}, names
    settings = set(Settings.model_fields)
    for route in wire.ROUTES:
        values = {v for v in dataclasses.asdict(route).values() if isinstance(v, str)}
        assert not values & settings, (route.name, values & settings)


def test_the_server_table_is_the_wire_table_with_limits() -> None:
    assert [r.name for r in ROUTES] == [r.name for r in wire.ROUTES]
    assert set(BODY_LIMITS) <= {r.name for r in ROUTES}
    for served, route in zip(ROUTES, wire.ROUTES, strict=True):
        assert dataclasses.asdict(route).items() <= dataclasses.asdict(served).items()
        if served.body_limit is not None:
            assert isinstance(getattr(Settings(_env_file=None), served.body_limit), int)


def test_each_route_constant_is_its_route_with_its_models() -> None:
    """The route modules name their route by constant (no lookup by name per request)."""
    from app.api import route_table as served

    for route in ROUTES:
        assert getattr(served, route.name.upper()) is route
        for name, model in (
            (route.request, route.request_model),
            (route.response, route.response_model),
            (route.form_options, route.options_model),
        ):
            assert (model.__name__ if model is not None else None) == name, route.name
