"""The ``addnorm`` command: parsing and dispatch (``parser``), one module per subcommand with
its flags and handler (``train``, ``translate``, ``generate``, ``sample``, ``export``,
``embed``, ``bench``, ``info``, ``demo``, ``explain``), and what they share: argument checks
(``checks``), exit codes (``exits``), common flags (``shared_flags``)."""

from addnorm.cli.parser import main

__all__ = ["main"]
