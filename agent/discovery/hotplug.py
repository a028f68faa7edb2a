"""Hot-plug: a pyudev netlink monitor on the infiniband, infiniband_verbs, net and pci subsystems.

Any add/remove/change there (a NIC appearing, VFs created by writing sriov_numvfs, a driver
rebind) asks the agent for a republish, debounced so a burst of uevents costs one pass. uevent
sockets are per network namespace: in a pod this needs `hostNetwork: true`. With udevd on the host
(`/run/udev/control` mounted) the monitor listens to udev's processed events, otherwise to the
kernel's own.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from agent import host_paths

log = logging.getLogger(__name__)

SUBSYSTEMS = ("infiniband", "infiniband_verbs", "net", "pci")


def udev_source(choice: str) -> str:
    if choice in ("udev", "kernel"):
        return choice
    return "udev" if os.path.exists(host_paths.UDEV_CONTROL) else "kernel"


class HotplugMonitor(threading.Thread):
    def __init__(self, on_event: Callable[[str, str, str], None], *, source: str = "auto") -> None:
        super().__init__(name="udev-monitor", daemon=True)
        self.on_event = on_event  # (action, subsystem, sys_path)
        self.source = udev_source(source)
        self._halt = threading.Event()
        self.ready = threading.Event()
        self.error = ""
        self.events = 0

    @property
    def started(self) -> bool:
        return self.ident is not None

    def state(self) -> str:
        return self.error or "listening"

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            import pyudev

            context = pyudev.Context()
            monitor = pyudev.Monitor.from_netlink(context, source=self.source)
            for subsystem in SUBSYSTEMS:
                monitor.filter_by(subsystem)
            monitor.start()
        except Exception as exc:  # no libudev, no netlink permission: hot-plug off, resync still works
            self.error = f"udev monitor unavailable: {exc}"
            log.warning("%s; relying on the periodic resync", self.error)
            self.ready.set()
            return
        log.info("udev monitor listening (%s source) on %s", self.source, ", ".join(SUBSYSTEMS))
        self.ready.set()
        while not self._halt.is_set():
            try:
                device = monitor.poll(timeout=0.5)
            except Exception as exc:  # a broken socket: stop listening, resync still works
                self.error = f"udev monitor failed: {exc}"
                log.warning("%s", self.error)
                return
            if device is None:
                continue
            self.events += 1
            log.info("uevent %s %s %s", device.action, device.subsystem, device.sys_path)
            self.on_event(str(device.action or ""), str(device.subsystem or ""), str(device.sys_path or ""))
