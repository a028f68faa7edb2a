"""Regenerate the checked-in gRPC stubs from the .proto files: `python -m agent.deviceplugin.proto.generate`.

The stubs are generated with the repository root as the include path, so their imports are the
package-qualified `agent.deviceplugin.proto.*_pb2`. Needs grpcio-tools (a dev dependency).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
PROTOS = ("deviceplugin_v1beta1.proto", "podresources_v1.proto")
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def stub_names() -> list[str]:
    return [proto.removesuffix(".proto") + suffix for proto in PROTOS for suffix in SUFFIXES]


def generate(out_root: Path) -> Path:
    """Write the stubs under `out_root` (mirroring the repository layout); return their folder."""
    from grpc_tools import protoc  # dev dependency: imported only when regenerating

    rel = HERE.relative_to(REPO)
    out_root.mkdir(parents=True, exist_ok=True)
    for proto in PROTOS:
        args = [
            "grpc_tools.protoc",
            f"-I{REPO}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            str(rel / proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
    return out_root / rel


def main() -> int:
    generate(REPO)
    print("\n".join(str(HERE / name) for name in stub_names()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
