"""What an installer run tells the user: result lines (stdout) and warnings (stderr)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.lines.append(line)

    def warn(self, line: str) -> None:
        self.warnings.append(line)
