"""`python -m addnorm` is the `addnorm` command."""

from addnorm.cli import main

raise SystemExit(main())
