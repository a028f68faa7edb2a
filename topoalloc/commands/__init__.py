"""`topoalloc` subcommands that belong to no runtime package (files in, text out)."""
