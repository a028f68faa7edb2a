from pathlib import Path

import pytest

from simulator.openb import TraceError, load_expected, load_nodes, load_pods, resolve_trace, trace_label
from tests.apis.paths import require_shared


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_eleven_column_pods_with_gpu_spec(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "p.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,12000,16384,1,1000,,LS,Running,0,10,0\n"
        "p1,6000,0,1,460,V100M16|V100M32|V100M32,BE,Pending,5,9,\n"
        "p2,88000,1000,0,0,,LS,Running,0,1,0\n",
    )
    p0, p1, p2 = load_pods(path)
    assert (p0.num_gpu, p0.gpu_milli, p0.sharing, p0.gpu_spec) == (1, 1000, False, ())
    assert (p1.sharing, p1.gpu_spec, p1.memory_mib) == (True, ("V100M16", "V100M32"), 0)
    assert p1.shape().gpu_pct == 46 and p2.shape().cpu_only


def test_five_column_pods(tmp_path: Path) -> None:
    path = write(tmp_path, "m.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,64000,1000,8,1000\n")
    (p,) = load_pods(path)
    assert (p.gpu_demand_milli, p.gpu_spec) == (8000, ())


@pytest.mark.parametrize(
    "row, message",
    [
        ("p0,abc,1,1,1000", "cpu_milli='abc'"),
        ("p0,1000,1,2,500", "gpu_milli=500 with num_gpu=2"),
        ("p0,1000,1,1,455", "finer than 1%"),
        ("p0,1000,-5,1,500", "negative"),
    ],
)
def test_malformed_rows_name_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    path = write(
        tmp_path, "bad.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np9,1000,1,0,0\n" + row + "\n"
    )
    with pytest.raises(TraceError, match=rf"bad.csv:3: .*{message}"):
        load_pods(path)


def test_missing_column_is_reported(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="missing column"):
        load_pods(write(tmp_path, "x.csv", "name,cpu_milli\np,1\n"))


def test_the_shared_openb_cluster_and_names() -> None:
    require_shared()
    nodes = load_nodes()
    assert len(nodes) == 1213 and sum(n.gpu_count for n in nodes) == 6212
    path = resolve_trace("multigpu50")
    assert trace_label(path) == "multigpu50" and len(load_pods(path)) == 9061
    with pytest.raises(TraceError, match="unknown trace 'nope'"):
        resolve_trace("nope")


def test_expected_results_of_the_fgd_artifact() -> None:
    require_shared()
    fgd = load_expected("default")["fgd"][100]
    assert (fgd.mean, fgd.sd, fgd.median) == (4.773, 0.106, 4.770)
    assert load_expected("gpushare20") == {}  # the paper did not run it
