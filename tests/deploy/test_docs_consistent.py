"""The user docs hold together: no internal issue numbers, no dead relative links (files and their
headings), no `topoalloc SUBCOMMAND --option` the command does not have, nothing said to be in the
README that is not there."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from apis.topology_constraint import NATIVE_FIELD
from topoalloc.cli import main
from topoalloc.commands.kube_access import DEFAULT_IN_A_POD, DEFAULT_WITH_FLAG

REPO = Path(__file__).resolve().parents[2]
# What users read: the README and docs/*.md (docs/design/ and docs/research/ are the engineers' notes).
USER_DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ALL_DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.MULTILINE)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("doc", USER_DOCS, ids=_rel)
def test_user_docs_cite_no_issue_numbers(doc: Path) -> None:
    found = [line.strip() for line in doc.read_text().splitlines() if ISSUE.search(line)]
    assert found == []


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = FENCE.sub("", doc.read_text())
    out: set[str] = set()
    for heading in HEADING.findall(text):
        base, n = slug(heading), 0
        while (f"{base}-{n}" if n else base) in out:
            n += 1
        out.add(f"{base}-{n}" if n else base)
    return out


@pytest.mark.parametrize("doc", ALL_DOCS, ids=_rel)
def test_relative_links_lead_somewhere(doc: Path) -> None:
    dead = []
    for match in LINK.finditer(FENCE.sub("", doc.read_text())):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        where = (doc.parent / path).resolve() if path else doc
        missing_anchor = bool(anchor) and where.suffix == ".md" and anchor not in anchors(where)
        if not where.exists() or missing_anchor:
            dead.append(target)
    assert dead == []


def _command(words: list[str]) -> tuple[str, click.Command]:
    """The (sub)command the words name: `agent inject-event` is the agent group's subcommand."""
    ctx = click.Context(main)
    command = main.get_command(ctx, words[0])
    assert command is not None, words[0]
    name = words[0]
    if isinstance(command, click.Group) and len(words) > 1 and words[1] in command.commands:
        name, command = f"{name} {words[1]}", command.commands[words[1]]
    return name, command


def _options(command: click.Command) -> set[str]:
    out = {"--help", "-h"}
    for param in command.params:
        out.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("-"))
    return out


def _mentions(text: str) -> list[tuple[str, str, bool]]:
    """(command, option, whether it has it) for each `topoalloc SUB ... --opt` in a code span or a
    code block line, and each code span that starts with a subcommand's name (`allocate --claim`)."""
    names = set(main.list_commands(click.Context(main)))
    spans = CODE_SPAN.findall(FENCE.sub("", text))
    lines = [*spans, *(line for block in FENCE.findall(text) for line in block.splitlines())]
    found = []
    for line in lines:
        for part in re.split(r"[|;#]|&&", line):
            words = part.split()
            if "topoalloc" in words:
                words = [w for w in words[words.index("topoalloc") + 1 :] if w != "--debug"]
            elif line not in spans:
                continue
            if not words or words[0] not in names:
                continue
            name, command = _command(words)
            have = _options(command)
            for word in words[1:]:
                option = re.match(r"(--?[a-zA-Z][\w-]*)", word)
                if option and word.startswith("-"):
                    found.append((name, option.group(1), option.group(1) in have))
    return found


@pytest.mark.parametrize("doc", USER_DOCS, ids=_rel)
def test_every_option_the_docs_give_a_subcommand_is_one_it_has(doc: Path) -> None:
    missing = sorted({f"{name} {opt}" for name, opt, has in _mentions(doc.read_text()) if not has})
    assert missing == []


def test_the_option_finder_finds_what_it_should() -> None:
    text = "Run `topoalloc simulate --paper default --nope` or `allocate --claim F`.\n"
    text += "```\ntopoalloc agent inject-event /tmp/e --gpu 3  # to an agent run with --fixture-events\n```\n"
    assert _mentions(text) == [
        ("simulate", "--paper", True),
        ("simulate", "--nope", False),
        ("allocate", "--claim", True),
        ("agent inject-event", "--gpu", True),
    ]


def test_what_the_docs_say_the_readme_holds_is_there() -> None:
    readme = (REPO / "README.md").read_text()
    missing = []
    for doc in USER_DOCS:
        text = " ".join(doc.read_text().split())
        for said in re.findall(r"README's `([^`]+)`", text):
            if f"`{said}`" not in readme and said not in readme:
                missing.append(f"{_rel(doc)}: {said}")
    assert missing == []


def test_each_kubeconfig_help_says_the_default_the_cli_doc_says() -> None:
    """docs/cli.md, "The cluster a command talks to", names which commands find a pod's service
    account by themselves and which take --in-cluster; each command's --help says the same, and
    every command with a --kubeconfig is named."""
    text = " ".join((REPO / "docs" / "cli.md").read_text().split())
    section = text.split("## The cluster a command talks to")[1].split(" ## ")[0]
    by_itself, told = re.search(
        r"\(([^;]*) default to the pod's service account there; ([^)]*) take", section
    ).groups()
    said = {name: DEFAULT_IN_A_POD for name in re.findall(r"`([a-z-]+)`", by_itself)}
    said.update({name: DEFAULT_WITH_FLAG for name in re.findall(r"`([a-z-]+)`", told)})
    having = set()
    for name in main.list_commands(click.Context(main)):
        _, command = _command([name])
        option = next((p for p in command.params if "--kubeconfig" in p.opts), None)
        if option is None:
            continue
        having.add(name)
        assert said.get(name, "") in " ".join(str(getattr(option, "help", "")).split()), name
    assert having == set(said)


def test_no_doc_lists_a_field_the_code_reads_as_not_read() -> None:
    """The native PodGroup's topology constraint is read (apis/topology_constraint.py) as the gang's
    required level; no user doc may say otherwise."""
    field = NATIVE_FIELD.removeprefix("spec.")
    for doc in USER_DOCS:
        text = " ".join(doc.read_text().split())
        for listed in re.findall(r"Not read: (.*?)\.(?: |$)", text):
            assert field not in listed, _rel(doc)
