"""The ``addnorm`` command: parsing and dispatch (``parser``), argument checks (``checks``),
the subcommand handlers (``commands``), and the demo and explain jobs."""

from addnorm.cli.parser import main

__all__ = ["main"]
