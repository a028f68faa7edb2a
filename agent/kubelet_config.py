"""kubelet's Topology Manager and CPU manager policies, read from its configuration file.

kubelet is configured by a KubeletConfiguration file (kubeadm writes /var/lib/kubelet/config.yaml)
or by flags; the file is what the agent can read (a read-only hostPath). Values given in the agent's
own config (`kubelet:` block) win over the file, for kubelets configured by flags. Reading it is
cheap: the file is parsed again only when its modification time changes. A missing file means
kubelet's defaults (no Topology Manager, CPU manager `none`), with a warning once.

Not asked over the API (`/api/v1/nodes/<node>/proxy/configz`): that needs `nodes/proxy`, which
also grants exec into every pod of the node.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent import host_paths
from apis.kubelet_policy import CPU_POLICIES, KUBELET_POLICIES, SCOPES
from apis.quantity import Quantity

log = logging.getLogger(__name__)

DEFAULT_KUBELET_CONFIG = host_paths.KUBELET_CONFIG


@dataclass(frozen=True)
class KubeletPolicies:
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    cpu_manager_policy: str = "none"
    reserved_cpus: tuple[int, ...] = ()  # reservedSystemCPUs
    reserved_cpu_count: int = 0  # whole CPUs of kubeReserved + systemReserved (without the above)
    source: str = "kubelet defaults"


@dataclass
class KubeletSettings:
    """The agent config's `kubelet:` block; empty values come from the file."""

    config_file: str = DEFAULT_KUBELET_CONFIG
    topology_manager_policy: str = ""
    topology_manager_scope: str = ""
    cpu_manager_policy: str = ""
    reserved_system_cpus: str = ""


class KubeletConfigError(ValueError):
    pass


def parse_cpuset(text: str) -> tuple[int, ...]:
    """A cpuset ("0-1,4") as CPU ids. Raises KubeletConfigError."""
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or int(high or low) < int(low):
            raise KubeletConfigError(f"not a cpuset: {text!r}")
        out.extend(range(int(low), int(high or low) + 1))
    return tuple(sorted(set(out)))


def _reserved_count(doc: dict[str, Any]) -> int:
    """Whole CPUs of kubeReserved + systemReserved, rounded up, as the static policy reserves them."""
    milli = 0
    for block in ("kubeReserved", "systemReserved"):
        value = (doc.get(block) or {}).get("cpu")
        if value is not None:
            milli += Quantity.parse(str(value), f"{block}.cpu").milli_value()
    return -(-milli // 1000)


def policies_from(doc: dict[str, Any], settings: KubeletSettings, source: str) -> KubeletPolicies:
    """The policies of one KubeletConfiguration document with the agent's overrides. Raises
    KubeletConfigError naming the value that is not one kubelet takes."""

    def pick(override: str, key: str, default: str, allowed: tuple[str, ...] | dict[str, str]) -> str:
        value = override or str(doc.get(key) or default)
        if value not in allowed:
            raise KubeletConfigError(f"{key}: {value!r} is not one of {', '.join(allowed)}")
        return value

    policy = pick(settings.topology_manager_policy, "topologyManagerPolicy", "none", KUBELET_POLICIES)
    scope = pick(settings.topology_manager_scope, "topologyManagerScope", "container", SCOPES)
    cpu = pick(settings.cpu_manager_policy, "cpuManagerPolicy", "none", CPU_POLICIES)
    reserved = settings.reserved_system_cpus or str(doc.get("reservedSystemCPUs") or "")
    try:
        count = 0 if reserved else _reserved_count(doc)
    except ValueError as exc:
        raise KubeletConfigError(str(exc)) from None
    return KubeletPolicies(policy, scope, cpu, parse_cpuset(reserved), count, source)


class KubeletConfigReader:
    """`policies()` from the file, read again only when it changed."""

    def __init__(self, settings: KubeletSettings) -> None:
        self.settings = settings
        self._stamp: tuple[float, int] | None = None
        self._cached = KubeletPolicies()
        self._warned = ""
        self.error = ""

    def policies(self) -> KubeletPolicies:
        path = Path(self.settings.config_file)
        try:
            st = os.stat(path)
        except OSError as exc:
            self._warn(f"kubelet config {path} not readable ({exc.strerror}): kubelet defaults assumed")
            return self._from({}, "kubelet defaults")
        stamp = (st.st_mtime, st.st_size)
        if stamp == self._stamp:
            return self._cached
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            if not isinstance(doc, dict):
                raise KubeletConfigError("not a KubeletConfiguration mapping")
        except (OSError, UnicodeDecodeError, yaml.YAMLError, KubeletConfigError) as exc:
            self._warn(f"kubelet config {path} unusable ({exc}): kubelet defaults assumed")
            return self._from({}, "kubelet defaults")
        self._stamp = stamp
        self._cached = self._from(doc, str(path))
        return self._cached

    def _from(self, doc: dict[str, Any], source: str) -> KubeletPolicies:
        try:
            got = policies_from(doc, self.settings, source)
            self.error = ""
            return got
        except KubeletConfigError as exc:
            self.error = f"{source}: {exc}"
            self._warn(f"kubelet policies not published: {self.error}")
            return KubeletPolicies(source=f"unusable: {self.error}")

    def _warn(self, message: str) -> None:
        if message != self._warned:
            log.warning("%s", message)
            self._warned = message
