"""PCI addresses: NVML writes `00000000:1B:00.0`, sysfs writes `0000:1b:00.0`; both mean one device."""

from __future__ import annotations

import re
from typing import NamedTuple

_BDF = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
ROOT_BUS = re.compile(r"^pci([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2})$")


class Bdf(NamedTuple):
    domain: int
    bus: int
    device: int
    function: int

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"

    @property
    def slot(self) -> tuple[int, int, int]:
        """The physical device: functions of one card (a dual-port NIC) share it."""
        return (self.domain, self.bus, self.device)


def parse_bdf(text: str | bytes) -> Bdf | None:
    """Parse any spelling of a PCI address; None when it is not one."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    match = _BDF.match(text.strip())
    if match is None:
        return None
    domain, bus, dev, fn = match.groups()
    return Bdf(int(domain or "0", 16), int(bus, 16), int(dev, 16), int(fn, 16))


def normalize_bdf(text: str | bytes) -> str:
    """The sysfs spelling (`0000:1b:00.0`); raises ValueError for something that is not a BDF."""
    bdf = parse_bdf(text)
    if bdf is None:
        raise ValueError(f"not a PCI address: {text!r}")
    return str(bdf)


def nvml_bus_id(bdf: str) -> str:
    """NVML's spelling of a sysfs address (8-digit domain, upper-case hex)."""
    parsed = parse_bdf(bdf)
    if parsed is None:
        raise ValueError(f"not a PCI address: {bdf!r}")
    return f"{parsed.domain:08X}:{parsed.bus:02X}:{parsed.device:02X}.{parsed.function:X}"
