from __future__ import annotations

from pathlib import Path

import pytest

from tests.service.pki import Pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki.create(tmp_path / "pki")
