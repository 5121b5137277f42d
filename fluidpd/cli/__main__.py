"""`python -m fluidpd.cli`: the `fluidpd` command."""

import sys

from fluidpd.cli import main

sys.exit(main())
