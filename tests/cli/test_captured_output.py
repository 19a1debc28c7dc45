"""CapturedOutput holds what is printed in its block (Python's streams and warnings, and file
descriptors 1 and 2, where C++ code writes) and shows it on stderr only when asked.

Provenance: the block writes one marker by each route; the held text is read back for each.
"""

from __future__ import annotations

import os
import sys
import warnings

from addnorm.cli.captured_output import CapturedOutput

ROUTES = ["held: print", "held: stderr", "held: warning", "held: fd 1", "held: fd 2"]


def noise() -> None:
    print(ROUTES[0])
    print(ROUTES[1], file=sys.stderr)
    warnings.warn(ROUTES[2], UserWarning, stacklevel=1)
    os.write(1, (ROUTES[3] + "\n").encode())
    os.write(2, (ROUTES[4] + "\n").encode())


def test_every_route_is_held_and_shown_on_stderr_when_asked(capfd):
    with CapturedOutput() as held:
        noise()
    assert capfd.readouterr() == ("", "")
    assert all(route in held.text for route in ROUTES), held.text
    held.show()
    shown = capfd.readouterr()
    assert shown.out == "" and all(route in shown.err for route in ROUTES)


def test_disabled_it_holds_nothing(capfd):
    with CapturedOutput(enabled=False) as held:
        print(ROUTES[0])
        os.write(2, (ROUTES[4] + "\n").encode())
    out, err = capfd.readouterr()
    assert held.text == "" and ROUTES[0] in out and ROUTES[4] in err
