"""Replay the session recorded against kube-apiserver v1.32 (../shared/wire/apiserver/) on the fake, in the
recorded order, and compare every answer: status, headers, and body (byte for byte for the error and
Status bodies, structurally with key order for objects, ignoring uids, resourceVersions and timestamps).
The recorded watch streams, opened at the same point of the session, must show the same events."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.apis.paths import require_shared
from tests.support.fakeapi import FakeApiServer, ServerThread

from .wire import Answer, WatchReader, load, normalise, ordered, replay, send, stream_lines

require_shared()

WATCHES = ("watch-pods", "watch-pods-no-bookmarks")


@dataclass
class Session:
    answers: dict[str, Answer]
    watches: dict[str, WatchReader]
    uids: dict[str, str]
    store_rv_at_end: str


BEFORE_WATCHES = (
    "pod-create-w0",
    "pod-list",
    "pod-list-allnamespaces-limit1",
    "pod-list-fieldselector-unassigned",
    "pod-list-labelselector",
    "node-get",
    "node-get-notfound",
    "node-list",
)
WHILE_WATCHING = (
    "pod-create",
    "pod-create-alreadyexists",
    "pod-patch-merge-annotations",
    "pod-binding-post",
    "pod-get-bound",
    "pod-binding-post-conflict",
    "pod-binding-post-notfound",
    "create-w1b",
    "pod-binding-post-uid-mismatch",
    "pod-patch-add-gate-to-ungated-pod-json",
    "pod-patch-add-gate-to-ungated-pod-merge",
    "pod-create-gated",
    "pod-patch-add-second-gate-strategic",
    "pod-patch-remove-gate-json",
    "pod-patch-readd-gate-after-removal",
    "pod-status-patch-condition",
    "pod-delete-graceful-bound",
    "pod-delete-force",
    "pod-delete-unbound",
    "pod-delete-notfound",
)
AFTER_COMPACTION = ("pod-list-too-old-rv-exact", "pod-list-too-old-rv-notolderthan", "pod-list-rv-in-future")


def _create_w1b(url: str) -> Answer:
    rec = load("pod-create")
    body = json.loads(rec.request_body or b"{}")
    body["metadata"]["name"] = "w1b"
    return send(url, "POST", rec.path, rec.request_headers, json.dumps(body).encode())


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    server = FakeApiServer(bookmark_interval=0.2, bookmark_before_timeout=0.2, future_rv_wait=0.2)
    with ServerThread(server):
        server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "wire"}})
        for node in load("node-list").json()["items"]:
            server.put({"apiVersion": "v1", "kind": "Node", **node})
        url = server.url
        answers: dict[str, Answer] = {}

        def step(name: str) -> None:
            answers[name] = replay(url, load(name))

        for name in BEFORE_WATCHES:
            step(name)
        w0_rv = answers["pod-create-w0"].json()["metadata"]["resourceVersion"]

        # The recorded watches started at w0's resourceVersion, before everything below happened.
        watches = {}
        for name in WATCHES:
            path = re.sub(r"resourceVersion=\d+", f"resourceVersion={w0_rv}", load(name).path)
            path = re.sub(r"timeoutSeconds=\d+", "timeoutSeconds=60", path)
            watches[name] = WatchReader(url, path).start()
        server.wait_for_watches_blocking(len(WATCHES), "pods")

        for name in WHILE_WATCHING:
            if name == "create-w1b":  # not recorded itself; w1b is w1's twin
                answers[name] = _create_w1b(url)
            else:
                step(name)

        # Recorded after an etcd compaction: resourceVersion 2 is long gone.
        server.compact()
        for name in AFTER_COMPACTION:
            step(name)
        too_old = WatchReader(url, load("watch-pods-too-old-rv").path).start()
        watches["watch-pods-too-old-rv"] = too_old
        too_old.join()

        # Let one bookmark interval pass with the stream idle, so watch-pods shows a BOOKMARK.
        deadline = time.monotonic() + 5
        while (
            not any(b'"BOOKMARK"' in x for x in watches["watch-pods"].lines) and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        server.break_watches()
        for reader in watches.values():
            reader.join()
        uids = {o["metadata"]["name"]: o["metadata"]["uid"] for o in server.list_objects("pods")}
        yield Session(answers, watches, uids, server.resource_version)


OBJECT_STEPS = [
    "pod-create-w0",
    "pod-create",
    "pod-create-gated",
    "pod-patch-merge-annotations",
    "pod-get-bound",
    "pod-patch-remove-gate-json",
    "pod-status-patch-condition",
    "pod-delete-graceful-bound",
    "pod-delete-force",
    "pod-delete-unbound",
    "node-get",
]
LIST_STEPS = [
    "pod-list",
    "pod-list-allnamespaces-limit1",
    "pod-list-fieldselector-unassigned",
    "pod-list-labelselector",
    "pod-list-too-old-rv-notolderthan",
    "node-list",
]
EXACT_STEPS = [
    "pod-create-alreadyexists",
    "pod-binding-post",
    "pod-binding-post-conflict",
    "pod-binding-post-notfound",
    "pod-patch-add-gate-to-ungated-pod-json",
    "pod-patch-add-gate-to-ungated-pod-merge",
    "pod-patch-add-second-gate-strategic",
    "pod-patch-readd-gate-after-removal",
    "pod-delete-notfound",
    "node-get-notfound",
    "pod-list-too-old-rv-exact",
]


@pytest.mark.parametrize("name", OBJECT_STEPS + LIST_STEPS + EXACT_STEPS)
def test_status_and_headers_match(session: Session, name: str) -> None:
    rec, got = load(name), session.answers[name]
    assert got.status == rec.status
    assert got.headers["content-type"] == rec.header("Content-Type") == "application/json"
    assert got.headers["cache-control"] == rec.header("Cache-Control")
    for header in ("audit-id", "x-kubernetes-pf-flowschema-uid", "x-kubernetes-pf-prioritylevel-uid"):
        assert got.headers.get(header), header


@pytest.mark.parametrize("name", EXACT_STEPS)
def test_error_and_status_bodies_are_byte_identical(session: Session, name: str) -> None:
    assert session.answers[name].body == load(name).response_body


@pytest.mark.parametrize("name", OBJECT_STEPS)
def test_objects_match_in_content_and_key_order(session: Session, name: str) -> None:
    got, want = normalise(session.answers[name].json()), normalise(load(name).json())
    assert got == want
    assert ordered(got) == ordered(want)


@pytest.mark.parametrize("name", LIST_STEPS)
def test_lists_match(session: Session, name: str) -> None:
    got, want = session.answers[name].json(), load(name).json()
    assert set(got["metadata"]) == set(want["metadata"]) == {"resourceVersion"}
    assert int(got["metadata"]["resourceVersion"]) > 0
    assert normalise(got) == normalise(want)
    assert ordered(normalise(got)) == ordered(normalise(want))


def test_object_metadata_is_fresh(session: Session) -> None:
    """uid, creationTimestamp and resourceVersion exist where the recording has them."""
    created = session.answers["pod-create"].json()["metadata"]
    assert re.fullmatch(r"[0-9a-f-]{36}", created["uid"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created["creationTimestamp"])
    assert "generation" not in created  # pods have none in v1.32, as recorded


def test_uid_precondition_message(session: Session) -> None:
    rec, got = load("pod-binding-post-uid-mismatch"), session.answers["pod-binding-post-uid-mismatch"]
    assert got.status == rec.status == 409
    recorded_uid = "fe04c9e8-c573-4cd3-9291-f4ec248df083"
    assert recorded_uid in rec.response_body.decode()
    assert got.body == rec.response_body.replace(recorded_uid.encode(), session.uids["w1b"].encode())


def test_too_large_resource_version(session: Session) -> None:
    rec, got = load("pod-list-rv-in-future"), session.answers["pod-list-rv-in-future"]
    assert got.status == rec.status == 504
    assert got.headers["retry-after"] == rec.header("Retry-After") == "1"
    want = rec.json()
    want["message"] = want["message"].replace("current: 595", f"current: {session.store_rv_at_end}")
    assert got.json() == want
    assert ordered(got.json()) == ordered(want)


def test_watch_with_too_old_resource_version_is_an_error_event(session: Session) -> None:
    reader = session.watches["watch-pods-too-old-rv"]
    recorded = stream_lines("watch-pods-too-old-rv")
    assert reader.status == 200
    assert len(reader.lines) == len(recorded) == 1
    # The number in parentheses is the oldest resourceVersion still resumable, which differs by server.
    oldest = re.compile(rb"too old resource version: 2 \(\d+\)")
    assert oldest.sub(b"<>", reader.lines[0]) == oldest.sub(b"<>", recorded[0])


@pytest.mark.parametrize("name", WATCHES)
def test_watch_streams_show_the_recorded_events(session: Session, name: str) -> None:
    reader = session.watches[name]
    assert reader.status == 200
    assert reader.headers["content-type"] == "application/json"
    assert reader.headers["transfer-encoding"] == "chunked"
    events = [json.loads(line) for line in reader.lines]
    got = [e for e in events if e["type"] != "BOOKMARK"]
    want = [json.loads(line) for line in stream_lines(name) if b'"BOOKMARK"' not in line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in got] == [
        (e["type"], e["object"]["metadata"]["name"]) for e in want
    ]
    assert [ordered(normalise(e)) for e in got] == [ordered(normalise(e)) for e in want]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in got]
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)
    if "no-bookmarks" in name:
        assert all(e["type"] != "BOOKMARK" for e in events)


def test_bookmark_objects_have_the_recorded_shape(session: Session) -> None:
    bookmarks = [json.loads(x) for x in session.watches["watch-pods"].lines if b'"BOOKMARK"' in x]
    recorded = [x for x in stream_lines("watch-pods") if b'"BOOKMARK"' in x]
    assert bookmarks, "the stream stayed idle past the 0.2 s bookmark interval: a BOOKMARK was due"
    rv = re.compile(rb'"resourceVersion":"\d+"')
    for bookmark in bookmarks:
        line = json.dumps(bookmark, separators=(",", ":")).encode() + b"\n"
        assert rv.sub(b"<rv>", line) == rv.sub(b"<rv>", recorded[0])
    # A bookmark carries the newest resourceVersion the stream has reached, never one it went back on.
    events = [json.loads(x) for x in session.watches["watch-pods"].lines]
    seen = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert seen == sorted(seen)
