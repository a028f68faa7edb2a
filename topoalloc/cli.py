"""The one `topoalloc` command. Subcommands live beside the code they drive and load lazily,
so `topoalloc allocate` never imports the agent's NVML stack and vice versa."""

from __future__ import annotations

import importlib

import click

from topoalloc.errors import EXIT_TABLE, ConventionGroup, enable_debug

# name -> "module:attribute" of a click command or group
SUBCOMMANDS: dict[str, str] = {
    "agent": "topoalloc.commands.agent:agent",
    "inspect": "topoalloc.commands.inspect:inspect",
    "allocate": "topoalloc.commands.allocate:allocate",
    "allocator": "topoalloc.commands.allocator:allocator",
    "certs": "topoalloc.commands.certs:certs",
    "simulate": "topoalloc.commands.simulate:simulate",
    "demo": "topoalloc.commands.simulate:demo",
    "defrag": "topoalloc.commands.defrag:defrag",
    "priority-mix": "topoalloc.commands.priority_mix:priority_mix",
    "topology": "topoalloc.commands.topology:topology",
    "topology-mix": "topoalloc.commands.topology_mix:topology_mix",
    "install": "topoalloc.commands.install:install",
    "upgrade": "topoalloc.commands.install:upgrade",
    "uninstall": "topoalloc.commands.install:uninstall",
    "doctor": "topoalloc.commands.doctor.command:doctor",
    "explain": "topoalloc.commands.explain.command:explain",
    "version": "topoalloc.commands.version:version",
}


class LazyGroup(ConventionGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each subcommand's whole first sentence, wrapped, never cut off with '...'."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=1000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # A subcommand whose module is not built yet must not break the others.
            if exc.name and module_name.startswith(exc.name):
                return None
            raise
        return getattr(module, attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_TABLE)
@click.version_option(package_name="topoalloc")
@click.option(
    "--debug",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=enable_debug,
    help="Show the Python traceback of an internal error.",
)
def main() -> None:
    """Topology-aware GPU/RDMA allocation for Kubernetes."""


if __name__ == "__main__":  # pragma: no cover
    main()
