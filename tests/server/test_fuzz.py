"""Schemathesis generates requests from the server's own OpenAPI schema (every operation, valid and invalid
bodies): none may get a 5xx."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tests.server.live_server import LiveServer, tiny_loader


@pytest.fixture(scope="module")
def fuzz_server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    live = LiveServer(tiny_loader(tiny_checkpoint, max_model_len=48, num_kv_pages=64))  # bounded generations
    yield live
    live.wait_idle()  # whatever the fuzzer sent, no request holds KV pages afterwards
    live.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_server: LiveServer):
    return schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")


def test_openapi_fuzz_finds_no_server_errors(api_schema, fuzz_server: LiveServer) -> None:
    # schemathesis' own pytest plugin does not run under pytest 9: drive hypothesis over each operation here
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {
        "/generate",
        "/v1/completions",
        "/v1/chat/completions",
        "/status/{request_id}",
    }
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case) -> None:
            case.call_and_validate(base_url=fuzz_server.url, timeout=60, checks=[not_a_server_error])

        fuzz()
