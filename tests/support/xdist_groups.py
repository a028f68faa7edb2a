"""pytest-xdist's `--dist loadgroup` scheduler, with the real-cluster tier grouped by release.

`make test` runs the suite on two workers. Each Kubernetes release's tests (tests/cluster) must run
on one worker, so that a worker starts one control plane and not every release's; everything else
is handed out test by test. xdist's own grouping (an `xdist_group` mark, which tests/cluster's
conftest adds) renames the test on the worker to carry the group, which pytest 9.2's structured node
ids silently undo (pytest-xdist issue 1386). So the group is read here from what the controller
does see: the release in the test id (`test_x[k8s-1.35-gpu]`), or a `@group` suffix where xdist
manages to add one.
"""

from __future__ import annotations

from xdist.scheduler import LoadGroupScheduling

from tests.support.kube_releases import RELEASE_IN_TEST_ID


class ReleaseGroupScheduling(LoadGroupScheduling):
    """LoadGroupScheduling whose groups also include one per Kubernetes release."""

    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        if scope != nodeid:  # xdist's own `@group` suffix
            return scope
        found = RELEASE_IN_TEST_ID.search(nodeid)
        return found.group(1) if found else nodeid
