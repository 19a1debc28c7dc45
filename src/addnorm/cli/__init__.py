"""The ``addnorm`` command: parsing and dispatch (``parser``), one module per subcommand with
its flags and handler (``train``, ``translate``, ``generate``, ``sample``, ``export``,
``embed``, ``bench``, ``info``, ``demo``, ``explain``), and what they share: argument checks
(``checks``), exit codes (``exits``), common flags (``shared_flags``), the texts ``translate``
and ``embed`` read (``translate_input``) and digit grids (``grid``)."""

from addnorm.cli.parser import main

__all__ = ["main"]
