"""Selector parsing and matching on their own."""

from __future__ import annotations

import pytest

from tests.support.fakeapi.resources import path_getter
from tests.support.fakeapi.selectors import SelectorError, parse_field_selector, parse_label_selector

LABELS = {"app": "trainer", "scheduling.x-k8s.io/pod-group": "pg-1", "rank": "3"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("", True),
        ("app=trainer", True),
        ("app==trainer", True),
        ("app=other", False),
        ("app!=other", True),
        ("missing!=x", True),
        ("scheduling.x-k8s.io/pod-group=pg-1,app=trainer", True),
        ("scheduling.x-k8s.io/pod-group=pg-1,app=other", False),
        ("app in (a, trainer)", True),
        ("app in (a,b)", False),
        ("app notin (a,b)", True),
        ("missing notin (a)", True),
        ("app", True),
        ("!app", False),
        ("!missing", True),
        ("rank>2", True),
        ("rank<3", False),
        ("missing>1", False),
        ("app in (trainer),rank in (3)", True),
    ],
)
def test_label_selector_matching(selector: str, matches: bool) -> None:
    assert parse_label_selector(selector).matches(LABELS) is matches


@pytest.mark.parametrize("bad", ["app in (a", "app)=x", "a=b=c", "rank>x", "=x", "app in a,b"])
def test_label_selector_errors(bad: str) -> None:
    with pytest.raises(SelectorError, match="unable to parse requirement"):
        parse_label_selector(bad)


def test_field_selector_parsing_and_escapes() -> None:
    selector = parse_field_selector(r"spec.nodeName=,status.phase!=Failed,metadata.name=a\,b")
    assert [(t.field, t.op, t.value) for t in selector.terms] == [
        ("spec.nodeName", "=", ""),
        ("status.phase", "!=", "Failed"),
        ("metadata.name", "=", "a,b"),
    ]
    getters = {f: path_getter(*f.split(".")) for f in ("spec.nodeName", "status.phase", "metadata.name")}
    assert selector.matches(
        {"metadata": {"name": "a,b"}, "spec": {}, "status": {"phase": "Pending"}}, getters
    )
    assert not selector.matches({"metadata": {"name": "a,b"}, "spec": {"nodeName": "n"}}, getters)
    assert selector.value_of("metadata.name") == "a,b"


def test_field_selector_errors() -> None:
    with pytest.raises(SelectorError):
        parse_field_selector("justaname")
    with pytest.raises(SelectorError, match=r"field label not supported: spec\.foo"):
        parse_field_selector("spec.foo=1").check_supported({"metadata.name": path_getter("metadata", "name")})


def test_boolean_fields_read_as_go_writes_them() -> None:
    getter = path_getter("spec", "hostNetwork")
    assert (getter({"spec": {"hostNetwork": True}}), getter({"spec": {}})) == ("true", "")
