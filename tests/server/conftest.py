from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.server.live_server import LiveServer, tiny_loader


@pytest.fixture(scope="session")
def server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    live = LiveServer(tiny_loader(tiny_checkpoint, max_model_len=512))
    yield live
    live.stop()
