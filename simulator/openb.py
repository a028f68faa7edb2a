"""Readers for the Alibaba "openb" GPU trace (cluster-trace-gpu-v2023) and the FGD artifact's results.

Formats: ../shared/traces/openb/FORMAT.md. Only the columns the FGD protocol uses are read
(name, cpu, memory, GPU count, per-GPU milli, GPU model list); times, QoS and phase are ignored.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from allocator.core.scoring.workload_mix import TaskShape

#: Environment variable naming the folder that holds the openb CSVs (overrides the search).
TRACES_ENV = "TOPOALLOC_OPENB_DIR"
_RELATIVE = Path("shared") / "traces" / "openb"
GPU_MILLI = 1000
NODE_FILE = "openb_node_list_gpu_node.csv"
POD_FILE = "openb_pod_list_{}.csv"
EXPECTED_DIR = "fgd_expected_results"


class TraceError(ValueError):
    """A trace file is missing or malformed; the message says which file and row."""


@dataclass(frozen=True, slots=True)
class OpenbNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    model: str


@dataclass(frozen=True, slots=True)
class OpenbPod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per requested GPU; < 1000 with num_gpu == 1 means a GPU-sharing task
    gpu_spec: tuple[str, ...] = ()  # accepted GPU models, empty = any

    @property
    def gpu_demand_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def sharing(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI

    def shape(self) -> TaskShape:
        """The task shape FGD's target workload groups by (memory is not part of it)."""
        if self.num_gpu == 0:
            return TaskShape(self.cpu_milli)
        return TaskShape(self.cpu_milli, self.gpu_milli // 10, self.num_gpu, self.gpu_spec)


def openb_dir() -> Path:
    """The folder holding the openb CSVs: $TOPOALLOC_OPENB_DIR, else ``shared/traces/openb`` in
    the repository's parent or any folder above the current directory or this package."""
    env = os.environ.get(TRACES_ENV)
    if env:
        return Path(env)
    starts = [Path.cwd().resolve(), Path(__file__).resolve().parent]
    for start in starts:
        for folder in (start, *start.parents):
            candidate = folder / _RELATIVE
            if (candidate / NODE_FILE).is_file():
                return candidate
    raise TraceError(f"cannot find {_RELATIVE}/{NODE_FILE} above {starts[0]}; set {TRACES_ENV}")


def resolve_trace(trace: str | Path) -> Path:
    """A trace name (``default``, ``multigpu50`` ...) or a path to a pod CSV."""
    path = Path(trace)
    if path.suffix == ".csv" or path.exists():
        if not path.is_file():
            raise TraceError(f"pod trace {path} does not exist")
        return path
    candidate = openb_dir() / POD_FILE.format(trace)
    if not candidate.is_file():
        known = sorted(
            p.stem.removeprefix("openb_pod_list_") for p in openb_dir().glob("openb_pod_list_*.csv")
        )
        raise TraceError(f"unknown trace {trace!r}; known: {', '.join(known)}")
    return candidate


def trace_label(path: Path) -> str:
    """``default`` for openb_pod_list_default.csv; the file stem for anything else."""
    return path.stem.removeprefix("openb_pod_list_")


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        try:
            reader = csv.DictReader(handle)
            missing = [c for c in required if c not in (reader.fieldnames or ())]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
            yield from enumerate(reader, start=2)
        except UnicodeDecodeError as exc:
            raise TraceError(
                f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start} of a block)"
            ) from None
        except csv.Error as exc:
            raise TraceError(f"{path}: not a CSV file: {exc}") from None


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    raw = (row.get(column) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        raise TraceError(f"{path}:{line}: {column}={raw!r} is not an integer") from None
    if value < 0:
        raise TraceError(f"{path}:{line}: {column}={value} is negative")
    return value


def load_nodes(path: Path | None = None) -> list[OpenbNode]:
    path = path or openb_dir() / NODE_FILE
    nodes = []
    for line, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        gpus = _int(path, line, row, "gpu")
        if gpus > 8:
            raise TraceError(f"{path}:{line}: {gpus} GPUs per node is more than the simulator models (8)")
        nodes.append(
            OpenbNode(
                name=row["sn"],
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                gpu_count=gpus,
                model=(row.get("model") or "").strip(),
            )
        )
    return nodes


def load_pods(path: Path) -> list[OpenbPod]:
    """Pods of an 11-column or 5-column (multigpu*) pod CSV, in file order."""
    pods = []
    for line, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        num_gpu = _int(path, line, row, "num_gpu")
        gpu_milli = _int(path, line, row, "gpu_milli")
        if num_gpu == 0:
            gpu_milli = 0
        elif not 0 < gpu_milli <= GPU_MILLI or (num_gpu > 1 and gpu_milli != GPU_MILLI):
            raise TraceError(f"{path}:{line}: gpu_milli={gpu_milli} with num_gpu={num_gpu}")
        if gpu_milli % 10:
            raise TraceError(f"{path}:{line}: gpu_milli={gpu_milli} is finer than 1% of a GPU")
        spec = tuple(sorted({m.strip() for m in (row.get("gpu_spec") or "").split("|") if m.strip()}))
        pods.append(
            OpenbPod(
                name=row["name"],
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=spec,
            )
        )
    return pods


@dataclass(frozen=True, slots=True)
class ExpectedPoint:
    mean: float
    sd: float
    median: float


#: The artifact's policy labels, by our policy names.
ARTIFACT_POLICY = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "gpuclustering": "03-GpuClustering",
    "gpupacking": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}


def load_expected(trace: str) -> dict[str, dict[int, ExpectedPoint]]:
    """The paper's unallocated GPU % for one trace: {policy: {arrived %: point}} (empty if the
    artifact did not run that trace)."""
    path = openb_dir() / EXPECTED_DIR / "summary_unalloc_gpu_pct.csv"
    by_label = {v: k for k, v in ARTIFACT_POLICY.items()}
    out: dict[str, dict[int, ExpectedPoint]] = {}
    if not path.is_file():
        return out
    for line, row in _rows(path, ("workload", "policy", "arrived_pct", "unalloc_gpu_pct_mean")):
        if row["workload"] != f"openb_pod_list_{trace}" or row["policy"] not in by_label:
            continue
        try:
            point = ExpectedPoint(
                float(row["unalloc_gpu_pct_mean"]),
                float(row["unalloc_gpu_pct_sd"]),
                float(row["unalloc_gpu_pct_median"]),
            )
        except (KeyError, ValueError):
            raise TraceError(f"{path}:{line}: unreadable numbers") from None
        out.setdefault(by_label[row["policy"]], {})[int(row["arrived_pct"])] = point
    return out


def load_expected_curves(trace: str, kind: str = "allo") -> dict[str, list[list[float]]]:
    """Per-seed curves from the artifact (``kind`` = allo, frag or frag_ratio) for x = 0..130:
    {policy: [curve per seed]}."""
    path = openb_dir() / EXPECTED_DIR / f"analysis_{kind}_discrete.csv"
    by_label = {v: k for k, v in ARTIFACT_POLICY.items()}
    out: dict[str, list[list[float]]] = {}
    if not path.is_file():
        return out
    for _line, row in _rows(path, ("workload", "sc_policy")):
        if row["workload"] != f"openb_pod_list_{trace}" or row["sc_policy"] not in by_label:
            continue
        curve = [float(row[str(x)]) if row.get(str(x)) else float("nan") for x in range(131)]
        out.setdefault(by_label[row["sc_policy"]], []).append(curve)
    return out
