"""The kustomize bases in deploy/ and daemonset/, rendered in Python.

The bases stay what GitOps users apply with `kubectl apply -k`; the installer renders the same
bases itself, so that it needs no kubectl (or a kubectl whose kustomize is older than the bases).
No library on PyPI renders kustomize faithfully (the ones there wrap the Go binary), and the bases
use a small part of it: `resources` (files and folders), `components`, `images`, inline JSON 6902
`patches` with a kind/name target and `configMapGenerator` from files with a fixed name (the
monitoring component's dashboard). Anything else in a kustomization is refused by name rather
than silently ignored, and tests/install/test_kustomize.py holds the output equal to
`kubectl kustomize` for every base.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from apis.documents import load_documents, parse_yaml_documents

Doc = dict[str, Any]
SUPPORTED = {"apiVersion", "kind", "resources", "components", "images", "patches", "configMapGenerator"}


class KustomizeError(ValueError):
    """A base the renderer cannot render: `where` is the kustomization file."""

    def __init__(self, where: Path, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


@dataclass(frozen=True)
class Image:
    """An `images:` entry: containers whose image is `name` (any tag) get `new_name:new_tag`."""

    name: str
    new_name: str = ""
    new_tag: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Image:
        return cls(str(data["name"]), str(data.get("newName") or ""), str(data.get("newTag") or ""))


def build(folder: Path, *, components: tuple[Path, ...] = (), images: tuple[Image, ...] = ()) -> list[Doc]:
    """The documents `kubectl kustomize folder` prints (in file order, not kustomize's kind order),
    with extra `components` applied and `images` set after the base's own, as `kustomize edit
    set image` would."""
    docs = _build(folder.resolve(), extra=tuple(c.resolve() for c in components))
    for image in images:
        _set_image(docs, image)
    return docs


def _kustomization(folder: Path) -> tuple[Path, Doc]:
    path = folder / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(folder, "no kustomization.yaml")
    data = load_documents(path, "kustomization")
    if len(data) != 1 or not isinstance(data[0], dict):
        raise KustomizeError(path, "expected one mapping")
    unknown = sorted(set(data[0]) - SUPPORTED)
    if unknown:
        raise KustomizeError(path, f"uses {', '.join(unknown)}, which the installer does not render")
    return path, data[0]


def _build(folder: Path, *, extra: tuple[Path, ...] = ()) -> list[Doc]:
    path, kust = _kustomization(folder)
    docs: list[Doc] = []
    for entry in kust.get("resources") or []:
        target = (folder / str(entry)).resolve()
        docs += _build(target) if target.is_dir() else _documents(target)
    docs += [_generated(path, folder, g) for g in kust.get("configMapGenerator") or []]
    _check_unique(docs, path)
    for component in [*(folder / str(c) for c in kust.get("components") or []), *extra]:
        docs = _component(component.resolve(), docs)
    _apply_own(path, folder, kust, docs)
    return docs


def _component(folder: Path, docs: list[Doc]) -> list[Doc]:
    path, kust = _kustomization(folder)
    if kust.get("kind") != "Component":
        raise KustomizeError(path, "a component must be of kind Component")
    for entry in kust.get("resources") or []:
        target = (folder / str(entry)).resolve()
        docs = docs + (_build(target) if target.is_dir() else _documents(target))
    docs = docs + [_generated(path, folder, g) for g in kust.get("configMapGenerator") or []]
    _check_unique(docs, path)
    _apply_own(path, folder, kust, docs)
    return docs


def _generated(path: Path, folder: Path, entry: Mapping[str, Any]) -> Doc:
    """A `configMapGenerator` entry's ConfigMap: `files` (`key=path` or `path`), `options.labels`.
    Only with `options.disableNameSuffixHash: true`: the installer does not compute kustomize's
    content hash, and a fixed name is what a Grafana sidecar or a chart expects anyway."""
    options = entry.get("options") or {}
    unknown = sorted(set(entry) - {"name", "namespace", "files", "options"}) + sorted(
        set(options) - {"labels", "disableNameSuffixHash"}
    )
    if unknown:
        raise KustomizeError(
            path, f"configMapGenerator uses {', '.join(unknown)}, which the installer does not render"
        )
    if options.get("disableNameSuffixHash") is not True:
        raise KustomizeError(path, "configMapGenerator: only with options.disableNameSuffixHash: true")
    data: dict[str, str] = {}
    for spec in entry.get("files") or []:
        key, _, name = str(spec).rpartition("=")
        source = folder / name
        data[key or Path(name).name] = source.read_text()
    meta: Doc = {"name": str(entry["name"])}
    if entry.get("namespace"):
        meta["namespace"] = str(entry["namespace"])
    if options.get("labels"):
        meta["labels"] = {str(k): str(v) for k, v in options["labels"].items()}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def _apply_own(path: Path, folder: Path, kust: Doc, docs: list[Doc]) -> None:
    for patch in kust.get("patches") or []:
        _patch(path, folder, patch, docs)
    for entry in kust.get("images") or []:
        _set_image(docs, Image.from_dict(entry))


def _documents(path: Path) -> list[Doc]:
    return [d for d in load_documents(path, "manifest") if isinstance(d, dict)]


def ident(doc: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(group, kind, namespace, name): what kustomize and the API server call one object."""
    group = str(doc.get("apiVersion", "")).rpartition("/")[0]
    meta = doc.get("metadata") or {}
    return group, str(doc.get("kind", "")), str(meta.get("namespace", "")), str(meta.get("name", ""))


def _check_unique(docs: list[Doc], path: Path) -> None:
    seen: set[tuple[str, str, str, str]] = set()
    for doc in docs:
        key = ident(doc)
        if key in seen:
            raise KustomizeError(path, f"{key[1]} {key[3]} is defined twice")
        seen.add(key)


def _patch(path: Path, folder: Path, entry: Mapping[str, Any], docs: list[Doc]) -> None:
    target = entry.get("target") or {}
    if set(target) - {"kind", "name", "namespace", "group", "version"}:
        raise KustomizeError(
            path, f"patch target {dict(target)} uses selectors the installer does not render"
        )
    text = entry.get("patch")
    if text is None and entry.get("path"):
        text = (folder / str(entry["path"])).read_text()
    ops = parse_yaml_documents(str(text or ""), "patch", str(path))
    if len(ops) != 1 or not isinstance(ops[0], list):
        raise KustomizeError(path, "only JSON 6902 patches (a list of operations) are rendered")
    matched = [d for d in docs if _matches(d, target)]
    if not matched:
        raise KustomizeError(path, f"patch target {dict(target)} matches nothing")
    for doc in matched:
        patched = jsonpatch.apply_patch(doc, ops[0])
        doc.clear()
        doc.update(patched)


def _matches(doc: Doc, target: Mapping[str, Any]) -> bool:
    group, kind, namespace, name = ident(doc)
    version = str(doc.get("apiVersion", "")).rpartition("/")[2]
    wanted = {"group": group, "version": version, "kind": kind, "namespace": namespace, "name": name}
    return all(str(value) == wanted[key] for key, value in target.items())


def _containers(node: Any) -> Iterator[Doc]:
    """Every container and init container anywhere in a document (pod templates, CronJobs)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


def image_name(image: str) -> str:
    """`registry:5000/topoalloc:0.1.0@sha256:...` -> `registry:5000/topoalloc`."""
    image = image.split("@", 1)[0]
    slash = image.rfind("/")
    colon = image.rfind(":")
    return image[:colon] if colon > slash else image


def _set_image(docs: list[Doc], image: Image) -> None:
    for doc in docs:
        for container in _containers(doc):
            current = str(container.get("image", ""))
            if image_name(current) != image.name:
                continue
            name = image.new_name or image.name
            tag = image.new_tag or current[len(image_name(current)) + 1 :].split("@", 1)[0]
            container["image"] = f"{name}:{tag}" if tag else name


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (embedded config files) as `|` blocks, as they are written in the bases."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def dump(docs: list[Doc]) -> str:
    """Documents as one multi-document YAML stream, as `kubectl kustomize` prints them."""
    return yaml.dump_all([copy.deepcopy(d) for d in docs], Dumper=_Dumper, sort_keys=False, width=1000)
