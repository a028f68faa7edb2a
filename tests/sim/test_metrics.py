import math

import numpy as np
import pytest

from simulator.metrics import EventLog, curves


def log() -> EventLog:
    # 10 GPUs; pods of 3, 3, 4 and 2 GPUs arrive, the 4-GPU one fails for lack of space
    return EventLog(
        capacity_pct=1000,
        arrived=np.array([300.0, 600.0, 1000.0, 1200.0]),
        allocated=np.array([300.0, 600.0, 600.0, 800.0]),
        fragmented=np.array([140.0, 80.0, 80.0, 20.0]),
    )


def test_arrived_percent_counts_failed_demand_too() -> None:
    assert log().arrived_pct.tolist() == [30.0, 60.0, 100.0, 120.0]


def test_unallocated_at_100_is_the_rejected_demand() -> None:
    c = curves(log())
    assert c.unallocated[100] == pytest.approx(40.0)
    assert c.unallocated[30] == pytest.approx(70.0)
    assert c.unallocated[101] == pytest.approx(40.0)  # no event rounds to 101: use 100..102
    assert math.isnan(c.unallocated[50])  # nothing within ±1


def test_bins_average_all_events_that_round_to_x() -> None:
    two = EventLog(1000, np.array([995.0, 1004.0, 1006.0]), np.array([900.0, 950.0, 960.0]), np.zeros(3))
    # 99.5 and 100.4 round to 100, 100.6 to 101
    assert curves(two).allocated[100] == pytest.approx(92.5)
    assert curves(two).allocated[101] == pytest.approx(96.0)


def test_fragmentation_amount_and_ratio() -> None:
    c = curves(log())
    assert c.frag_amount[30] == pytest.approx(14.0)  # 140 of 1000
    assert c.frag_ratio[30] == pytest.approx(20.0)  # 140 of 700 idle
    assert c.frag_ratio[120] == pytest.approx(10.0)  # 20 of 200 idle
