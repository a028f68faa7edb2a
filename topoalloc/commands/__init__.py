"""The `topoalloc` subcommands, one module each, loaded lazily by `topoalloc.cli`."""
