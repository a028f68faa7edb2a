"""Where the shared reference material lives: ../shared beside the repository (as in CI)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
PROTOCOL_DOC = SHARED / "reference" / "koordinator-protocol.md"
EXTENDER_WIRE = SHARED / "wire" / "kube-scheduler-extender"
