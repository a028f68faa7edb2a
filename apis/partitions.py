"""`scheduling.koordinator.sh/gpu-partitions` (GPUPartitionTable) on the Device CR (protocol 2.3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apis import decode as d
from apis import gojson, keys
from apis.errors import CodecError
from apis.gojson import sorted_map
from apis.quantity import Quantity


@dataclass(frozen=True)
class GPUPartition:
    minors: tuple[int, ...]
    gpu_link_type: str = ""
    ring_bus_bandwidth: Quantity | None = None
    allocation_score: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"minors": list(self.minors)}
        if self.gpu_link_type:
            out["gpuLinkType"] = self.gpu_link_type
        if self.ring_bus_bandwidth is not None:
            out["ringBusBandwidth"] = str(self.ring_bus_bandwidth)
        if self.allocation_score:
            out["allocationScore"] = self.allocation_score
        return out


@dataclass
class GPUPartitionTable:
    """GPU count -> partitions of that many GPUs, in table order."""

    by_size: dict[int, list[GPUPartition]] = field(default_factory=dict)

    def to_json(self) -> str:
        # Go encodes map[int] keys as decimal strings and sorts them as strings ("16" < "2").
        return gojson.dumps(
            sorted_map({str(n): [p.to_dict() for p in parts] for n, parts in self.by_size.items()})
        )


def parse_gpu_partitions(text: str) -> GPUPartitionTable:
    path = keys.GPU_PARTITIONS
    raw = gojson.loads(text, path)
    if raw is None:
        raise CodecError(path, "must be an object, not null", raw)
    data = d.obj(raw, path)
    table: dict[int, list[GPUPartition]] = {}
    for key, parts in data.items():
        kpath = d.join(path, key)
        try:
            size = int(key, 10)
        except ValueError:
            raise CodecError(kpath, "keys must be GPU counts written as decimal integers", key) from None
        if size <= 0:
            raise CodecError(kpath, "GPU count must be positive", key)
        if parts is None:
            table[size] = []
            continue
        if not isinstance(parts, list):
            raise CodecError(kpath, "expected a list of partitions", parts)
        out = []
        for i, part in enumerate(parts):
            ppath = d.join(kpath, i)
            pd = d.struct(part, ppath, ("minors", "gpuLinkType", "ringBusBandwidth", "allocationScore"))
            minors = d.array(pd, "minors", ppath)
            for j, m in enumerate(minors):
                if isinstance(m, bool) or not isinstance(m, int) or m < 0:
                    raise CodecError(
                        d.join(d.join(ppath, "minors"), j), "expected a non-negative GPU minor", m
                    )
            bw = pd.get("ringBusBandwidth")
            out.append(
                GPUPartition(
                    minors=tuple(minors),
                    gpu_link_type=d.string(pd, "gpuLinkType", ppath),
                    ring_bus_bandwidth=None
                    if bw is None
                    else Quantity.parse(bw, d.join(ppath, "ringBusBandwidth")),
                    allocation_score=d.integer(
                        pd, "allocationScore", ppath, minimum=-(2**63), maximum=2**63 - 1
                    ),
                )
            )
        table[size] = out
    return GPUPartitionTable(table)
