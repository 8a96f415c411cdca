"""The written status schema (encoder_client.status) against what a real server answers."""
import copy
from typing import get_type_hints

import pytest

from encoder_client.status import Histograms, Requests, ServerStatus, StatusError, Texts, check_status


@pytest.fixture(scope="module")
def status(tiny_server):
    with tiny_server.client() as client:
        client.encode(["warm the histograms up"])
        return client.server_status


def _schema_paths(schema, path=()):
    """Every field the schema names, nested ones included, as key paths."""
    for name, kind in get_type_hints(schema).items():
        yield (*path, name)
        if hasattr(kind, "__required_keys__"):
            yield from _schema_paths(kind, (*path, name))


def test_a_real_status_follows_the_schema_field_for_field(status):
    assert check_status(status) is status
    assert set(status) == set(ServerStatus.__annotations__), "a field the schema does not name"
    assert set(status["requests"]) == set(Requests.__annotations__)
    assert set(status["texts"]) == set(Texts.__annotations__)
    assert set(status["metrics"]["histograms"]) == set(Histograms.__annotations__)


def test_every_missing_field_is_named(status):
    paths = list(_schema_paths(ServerStatus))
    assert len(paths) == 67
    for path in paths:
        broken = copy.deepcopy(status)
        holder = broken
        for key in path[:-1]:
            holder = holder[key]
        del holder[path[-1]]
        with pytest.raises(StatusError, match=f"{'.'.join(path[:-1]) or 'status'}.* has no field '{path[-1]}'"):
            check_status(broken)


@pytest.mark.parametrize("path, value", [(("ready",), "yes"), (("workers_alive",), 1.5),
                                         (("requests", "served"), None), (("uptime_s",), True),
                                         (("metrics",), []), (("worker_busy_texts",), [])])
def test_a_field_of_the_wrong_kind_is_named(status, path, value):
    broken = copy.deepcopy(status)
    holder = broken
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    with pytest.raises(StatusError, match=".".join(path)):
        check_status(broken)
