"""Where the shared reference material lives: ../shared beside the repository (as in CI).

Tests that read it call `require_shared()`: without ../shared they are skipped with the reason, so
that `make test` in a clone elsewhere still runs everything else; `.ci/run` sets
TOPOALLOC_REQUIRE_SHARED=1, and then a missing ../shared fails those tests instead of skipping them.
"""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
PROTOCOL_DOC = SHARED / "reference" / "koordinator-protocol.md"
EXTENDER_WIRE = SHARED / "wire" / "kube-scheduler-extender"
APISERVER_WIRE = SHARED / "wire" / "apiserver"
REQUIRE_ENV = "TOPOALLOC_REQUIRE_SHARED"


def require_shared(missing: list[str] | None = None) -> None:
    """Skip the calling test (or, at import, the whole module) when ../shared is absent, unless
    TOPOALLOC_REQUIRE_SHARED=1 asks for it to be there.

    `missing` names further things the test needs (binaries, packages) that are absent: skipped
    as well, or failed under TOPOALLOC_REQUIRE_SHARED=1, where a skip would hide them."""
    required = os.environ.get(REQUIRE_ENV) == "1"
    if missing:
        text = f"not found: {'; '.join(missing)}"
        if required:
            pytest.fail(f"{text} ({REQUIRE_ENV}=1 requires them)", pytrace=False)
        pytest.skip(text, allow_module_level=True)
    if SHARED.is_dir() or required:
        return
    pytest.skip(
        f"reference material not found at {SHARED}: clone topoalloc beside shared/ to run this",
        allow_module_level=True,
    )
