"""`topoalloc agent --help` documents the device plugin flags."""

from __future__ import annotations

from click.testing import CliRunner

from topoalloc.cli import main


def test_help_documents_the_device_plugin_flags() -> None:
    result = CliRunner().invoke(main, ["agent", "--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # undo click's wrapping
    for flag in (
        "--device-plugin / --no-device-plugin",
        "--device-plugin-dir TEXT",
        "[default: /var/lib/kubelet/device-plugins]",
        "--pod-resources-socket TEXT",
        "[default: /var/lib/kubelet/pod-resources/kubelet.sock]",
        "--cdi-root TEXT",
        "--dev-root TEXT",
        "--state-dir TEXT",
    ):
        assert flag in text, flag
