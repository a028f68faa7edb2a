"""The docs say what the code does (issue 31, "Docs drift"): every subcommand listed where the
CLI is described, the fixture count, the preempt verb, how a gang waits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from topoalloc.cli import SUBCOMMANDS

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


@pytest.mark.parametrize("doc", ["cli.md", "architecture.md"])
def test_every_subcommand_is_named(doc: str) -> None:
    text = (DOCS / doc).read_text()
    missing = [name for name in SUBCOMMANDS if f"`{name}`" not in text]
    assert missing == []


def test_the_agent_doc_counts_the_fixtures_there_are() -> None:
    fixtures = [p for p in (REPO / "hw-fixtures").iterdir() if (p / "nvml.json").is_file()]
    said = re.search(r"`hw-fixtures/` holds (\w+) machines", (DOCS / "agent.md").read_text())
    assert said is not None and said[1] == NUMBERS[len(fixtures)]


def test_the_service_doc_does_not_call_a_served_verb_unimplemented() -> None:
    # The scheduler configurations name the verb (they ship it only together with the route).
    config = yaml.safe_load((REPO / "deploy" / "kube-scheduler" / "kube-scheduler-config.yaml").read_text())
    assert config["extenders"][0]["preemptVerb"] == "preempt"
    text = " ".join((DOCS / "service.md").read_text().split())
    assert not re.search(r"preemptVerb`? \([^)]*\) is not implemented|preemptVerb`? is not implemented", text)


def test_the_architecture_explains_how_a_gang_waits() -> None:
    text = (DOCS / "architecture.md").read_text()
    section = text.split("### How a gang waits")[1].split("\n#")[0]
    for words in ("topoalloc.io/gang", "scheduling gate", "queue order", "holding nothing", "held for gang"):
        assert words in " ".join(section.split()), words
