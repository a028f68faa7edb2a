"""The CRDs topoalloc needs: there, Established, their version served, and a schema that keeps every
field topoalloc writes. The API server prunes what a structural schema does not name, silently:
Koordinator's own Device CRD lacks topoalloc's topology fields (NVLink, PCIe switches), so every
Device would lose them and the allocator would place without them."""

from __future__ import annotations

from typing import Any

from topoalloc.commands.doctor.facts import JSON, Facts, meta
from topoalloc.commands.doctor.findings import Finding, fail, ok

CHECK = "crds"
MANAGED_BY = "app.kubernetes.io/managed-by"


def pruned_fields(wanted: Any, served: Any, path: str = "") -> list[str]:
    """The field paths `wanted` (a schema) names that `served` would prune, highest first: a
    field whose parent is pruned is not listed again."""
    if not isinstance(wanted, dict):
        return []
    if not isinstance(served, dict):
        return [path.lstrip(".") or "(the whole object)"]
    if served.get("x-kubernetes-preserve-unknown-fields") is True:
        return []
    out: list[str] = []
    served_props = served.get("properties") or {}
    for name, sub in (wanted.get("properties") or {}).items():
        out += pruned_fields(sub, served_props.get(name), f"{path}.{name}")
    if isinstance(wanted.get("items"), dict):
        out += pruned_fields(wanted["items"], served.get("items"), path + "[]")
    if isinstance(wanted.get("additionalProperties"), dict):
        out += pruned_fields(wanted["additionalProperties"], served.get("additionalProperties"), path + ".*")
    return out


def _version(crd: JSON, name: str) -> JSON | None:
    return next((v for v in (crd.get("spec") or {}).get("versions") or [] if v.get("name") == name), None)


def _condition(crd: JSON, kind: str) -> JSON:
    found = [c for c in (crd.get("status") or {}).get("conditions") or [] if c.get("type") == kind]
    return found[0] if found else {}


def _fix(name: str, served: JSON) -> str:
    ours = (meta(served).get("labels") or {}).get(MANAGED_BY) == "topoalloc"
    if ours:
        return f"topoalloc install (it applies deploy/crds/{name}.yaml again)"
    return (
        f"kubectl apply --server-side --force-conflicts -f deploy/crds/{name}.yaml: a superset of the "
        "schema there (every field keeps its type), so the other system's objects still validate"
    )


def check_crd(name: str, wanted: JSON, served: JSON | None) -> Finding:
    if served is None:
        return fail(
            CHECK,
            f"CRD {name} is not there: the allocator cannot watch its objects",
            "topoalloc install (or kubectl apply -k deploy/crds)",
        )
    established = _condition(served, "Established")
    if established.get("status") != "True":
        why = (
            established.get("message") or _condition(served, "NamesAccepted").get("message") or "no condition"
        )
        return fail(CHECK, f"CRD {name} is not Established: {why}", _fix(name, served))
    pruned: list[str] = []
    for version in (wanted.get("spec") or {}).get("versions") or []:
        have = _version(served, version.get("name", ""))
        if have is None or not have.get("served"):
            return fail(
                CHECK,
                f"CRD {name} does not serve {version.get('name')}, the version topoalloc reads and writes",
                _fix(name, served),
            )
        schema = ((version.get("schema") or {}).get("openAPIV3Schema")) or {}
        served_schema = ((have.get("schema") or {}).get("openAPIV3Schema")) or {}
        pruned += pruned_fields(schema, served_schema)
    if pruned:
        return fail(
            CHECK,
            f"CRD {name}'s schema lacks {len(pruned)} field(s) topoalloc writes: the API server prunes "
            f"them from every object ({', '.join(pruned[:4])}{', ...' if len(pruned) > 4 else ''})",
            _fix(name, served),
            [f"pruned: {p}" for p in pruned],
        )
    return ok(CHECK, f"CRD {name}: Established, served, keeps every field topoalloc writes")


def check(facts: Facts) -> list[Finding]:
    if "crds" in facts.unreadable:
        return [
            fail(
                CHECK,
                f"the CRDs could not be read: {facts.unreadable['crds']}",
                "run doctor with rights to read customresourcedefinitions",
            )
        ]
    if not facts.wanted_crds:
        return [
            fail(
                CHECK,
                "no CRD to compare with: deploy/crds is not beside this topoalloc",
                "run from a topoalloc checkout or pass --manifests",
            )
        ]
    return [
        check_crd(name, wanted, facts.crds.get(name)) for name, wanted in sorted(facts.wanted_crds.items())
    ]
