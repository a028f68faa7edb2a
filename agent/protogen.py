"""Regenerate the checked-in kubelet gRPC stubs from their .proto files: `python -m agent.protogen`
(`make protos`).

Each folder holds upstream .proto files, unchanged but for a header naming their source, and the
stubs generated from them. They are generated with the repository root as the include path, so the
stubs import each other package-qualified (`agent.deviceplugin.proto.*_pb2`). Needs grpcio-tools
(a dev dependency).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# folder (relative to the repository) -> its .proto files
PROTOS: dict[str, tuple[str, ...]] = {
    "agent/deviceplugin/proto": ("deviceplugin_v1beta1.proto", "podresources_v1.proto"),
    "agent/dra/proto": ("dra_v1.proto", "dra_v1beta1.proto", "pluginregistration_v1.proto"),
}
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def stub_names(folder: str) -> list[str]:
    return [proto.removesuffix(".proto") + suffix for proto in PROTOS[folder] for suffix in SUFFIXES]


def generate(out_root: Path, folder: str) -> Path:
    """Write the stubs of `folder` under `out_root` (mirroring the repository layout); return the
    folder they are in."""
    from grpc_tools import protoc  # dev dependency: imported only when regenerating

    out_root.mkdir(parents=True, exist_ok=True)
    for proto in PROTOS[folder]:
        args = [
            "grpc_tools.protoc",
            f"-I{REPO}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            f"{folder}/{proto}",
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {folder}/{proto}")
    return out_root / folder


def main() -> int:
    for folder in PROTOS:
        generate(REPO, folder)
        print("\n".join(str(REPO / folder / name) for name in stub_names(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
