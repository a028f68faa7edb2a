"""PATCH bodies by Content-Type: JSON merge patch, JSON patch and strategic merge patch."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import jsonpointer

from . import errors, strategic
from .resources import ResourceType

JsonObj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


def accepted_types(rt: ResourceType) -> list[str]:
    """What this fake accepts for `rt`. Server-side apply (`application/apply-patch+yaml`) is not
    implemented, and custom resources refuse strategic merge patch exactly as the apiserver does."""
    types = [JSON_PATCH, MERGE_PATCH]
    if rt.merge_schema is not None:
        types.append(STRATEGIC_PATCH)
    return types


def apply_patch(rt: ResourceType, content_type: str, original: JsonObj, body: bytes) -> JsonObj:
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type not in accepted_types(rt):
        raise errors.unsupported_media_type(accepted_types(rt))
    try:
        patch = json.loads(body or b"null")
    except ValueError as exc:
        raise errors.bad_request(f"error decoding patch: {exc}") from exc

    if media_type == JSON_PATCH:
        return _json_patch(original, patch)
    if media_type == MERGE_PATCH:
        if not isinstance(patch, dict):
            raise errors.bad_request("error decoding merge patch: the patch must be a JSON object")
        return merge_patch(original, patch)
    assert rt.merge_schema is not None
    try:
        return strategic.apply(original, patch, rt.merge_schema)
    except strategic.StrategicPatchError as exc:
        raise errors.bad_request(str(exc)) from exc


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null removes a member, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = merge_patch(result.get(name), value)
    return result


def _json_patch(original: JsonObj, operations: Any) -> JsonObj:
    if not isinstance(operations, list):
        raise errors.bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    try:
        patched = jsonpatch.JsonPatch(operations).apply(original)
    except jsonpatch.InvalidJsonPatch as exc:
        raise errors.bad_request(str(exc)) from exc
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        # The apiserver answers a patch that does not apply (failed `test`, missing path) with 422.
        raise errors.ApiError(422, "Invalid", str(exc), {}) from exc
    if not isinstance(patched, dict):
        raise errors.bad_request("the patched document is not a JSON object")
    return patched
