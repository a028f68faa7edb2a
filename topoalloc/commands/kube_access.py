"""Which cluster a command talks to, said the same way by every command that needs one (`agent`,
`allocator`, `inspect --node`, `defrag`, `topology`, `install`, `uninstall`, `upgrade`): the
--kubeconfig flag, else $KUBECONFIG (a list of files, as kubectl reads it), else ~/.kube/config,
unless the command runs in a pod (--in-cluster, or the service-account environment where the
command defaults to it).

A kubeconfig that is not there is the user's to fix: `error: kubeconfig (<file>): not found`,
exit 2, before any client library gets to log or raise about it.
"""

from __future__ import annotations

import os
from pathlib import Path

from topoalloc.errors import BadInput

DEFAULT_KUBECONFIG = "~/.kube/config"
# What each command's --help says of its --kubeconfig default, in the words of docs/cli.md ("The
# cluster a command talks to"): commands that find a pod's service account by themselves, and
# commands that are told to use it.
DEFAULT_IN_A_POD = "default: $KUBECONFIG, else ~/.kube/config; in a pod, its service account"
DEFAULT_WITH_FLAG = "default: $KUBECONFIG, else ~/.kube/config; --in-cluster: the pod's service account"
HINT = "pass --kubeconfig FILE, set KUBECONFIG, or run in a pod with a service account"


def kubeconfig_files(flag: str | None) -> tuple[str, list[Path]]:
    """(where, the files it names): the flag, else $KUBECONFIG's files, else ~/.kube/config."""
    if flag:
        return flag, [Path(flag).expanduser()]
    env = os.environ.get("KUBECONFIG", "")
    files = [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    if files:
        return f"KUBECONFIG={env}", files
    return DEFAULT_KUBECONFIG, [Path(DEFAULT_KUBECONFIG).expanduser()]


def require_kubeconfig(flag: str | None) -> str | None:
    """The kubeconfig file to load (None: the client library's default, which exists). Raises
    BadInput naming what was looked for when no file is there."""
    where, files = kubeconfig_files(flag)
    present = [f for f in files if f.is_file()]
    if not present:
        hint = f"; {HINT}" if where == DEFAULT_KUBECONFIG else ""
        raise BadInput("kubeconfig", where, f"not found{hint}")
    return str(present[0]) if flag or len(files) == 1 else None


def in_a_pod() -> bool:
    """The service-account environment kubelet gives every pod."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def config_error(flag: str | None, exc: Exception, *, in_cluster: bool = False) -> BadInput:
    """A kubeconfig (or in-cluster set-up) the client library refused, as the user's input."""
    where = "in-cluster service account" if in_cluster else kubeconfig_files(flag)[0]
    return BadInput("kubeconfig", where, str(exc).strip().rstrip("."))
