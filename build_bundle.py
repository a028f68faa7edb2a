"""The build step that puts the manifests into the wheel (pyproject.toml's cmdclass).

The kustomize bases (`deploy/`, `daemonset/`) and the Helm chart (`charts/`) stay where users of
the repository apply them (`kubectl apply -k deploy/`, `helm install topoalloc charts/topoalloc`);
a built package carries a copy of them as `topoalloc/_manifests/`, where `topoalloc install` finds
them outside a checkout (topoalloc/commands/installer/manifests.py). Only these three trees are
copied: nothing else of the checkout (hw-fixtures' sysfs trees, whose symlinks form cycles) is
walked. An editable install needs no copy: it runs from the checkout itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools.command.build_py import build_py

#: The trees a built package carries, relative to the project root (and to topoalloc/_manifests).
TREES = ("deploy", "daemonset", "charts")
BUNDLE = Path("topoalloc") / "_manifests"
_SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


class BuildPy(build_py):
    """build_py, then the manifests copied beside the built `topoalloc` package."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / BUNDLE
        for tree in TREES:
            source = Path(tree)
            if not source.is_dir():
                raise FileNotFoundError(f"{source.resolve()}: the package needs it (MANIFEST.in grafts it)")
            shutil.rmtree(target / tree, ignore_errors=True)
            shutil.copytree(source, target / tree, ignore=_SKIPPED, symlinks=False)
