"""The doctor's checks are pure over facts read at one instant (tests/doctor/healthy.py's NOW):
certificates made during a test are made at that instant too, however long the suite has run."""

from __future__ import annotations

import datetime as dt

import pytest

from allocator.runtime import certs
from tests.doctor.healthy import NOW


@pytest.fixture(autouse=True)
def _certificates_made_at_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(certs, "_now", lambda: dt.datetime.fromtimestamp(NOW, dt.UTC))
