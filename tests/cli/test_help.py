"""``--help`` and ``--version``: every flag of every subcommand says what it does and, where it
has one, its default; ``demo --help`` states the budgets the demo really uses.

Provenance: the parser itself (every action argparse holds, walked through the subparsers),
the tasks' default ``TrainConfig`` (the demo's budgets) and ``addnorm._version``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from addnorm._version import __version__
from addnorm.cli.help_format import has_default
from addnorm.cli.parser import build_parser, main


def _parsers(parser: argparse.ArgumentParser, path: str = "addnorm"):
    """``(path, parser)`` for ``parser`` and every subcommand parser below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def _help_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help line of ``action`` as ``--help`` prints it (defaults filled in)."""
    return parser.formatter_class(prog=parser.prog)._expand_help(action)


def _shown(default: object) -> str:
    return str(default) if not isinstance(default, Path) else default.as_posix()


def test_every_flag_of_every_subcommand_has_help_and_shows_its_default():
    problems = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            name = "/".join(action.option_strings) or action.dest
            if not action.help or action.help == argparse.SUPPRESS:
                problems.append(f"{path} {name}: no help")
                continue
            text = _help_of(parser, action)
            if has_default(action) and _shown(action.default) not in text:
                problems.append(f"{path} {name}: default {action.default!r} not in {text!r}")
            # Config-derived flags default to "not given" and state the config's value.
            derived = action.default is argparse.SUPPRESS and not isinstance(
                action, argparse._VersionAction)
            if derived and "(default " not in text:
                problems.append(f"{path} {name}: config default not stated in {text!r}")
    assert not problems, "\n".join(problems)


def test_the_walk_reaches_every_subcommand_and_the_train_tasks():
    paths = {path for path, _ in _parsers(build_parser())}
    assert {"addnorm generate", "addnorm sample", "addnorm demo", "addnorm bench",
            "addnorm train translate", "addnorm train lm", "addnorm train dit"} <= paths


def test_config_flags_carry_the_fields_description_not_only_the_default():
    parser = dict(_parsers(build_parser()))["addnorm train translate"]
    helps = {a.dest: _help_of(parser, a) for a in parser._actions}
    assert helps["max_minutes"].startswith("wall-clock budget of one invocation")
    assert "(default 4.0)" in helps["max_minutes"]  # the translate task's own budget
    assert "AdamW's moment decay rates" in helps["beta2"]  # "beta1, beta2: ..." entries


def test_generate_flags_state_their_defaults_in_help(capsys):
    assert main(["generate", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in ("--max-new-tokens", "(default: 200)", "(default: all)", "(default: 0)",
                 "(default: runs/lm)", "(default: 0.8)"):
        assert text in out, text


def test_version_prints_the_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"addnorm {__version__}\n"


def test_demo_help_states_the_budgets_of_the_tasks_default_configs(capsys):
    from addnorm.tasks.dit import DiTTask
    from addnorm.tasks.translate import TranslateTask

    assert main(["demo", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for cfg in (TranslateTask.default_train_config(), DiTTask.default_train_config()):
        assert f"{cfg.max_steps} steps in a {cfg.max_minutes:g}-minute budget" in out
        assert f"the task's, {cfg.max_minutes:g};" in out
