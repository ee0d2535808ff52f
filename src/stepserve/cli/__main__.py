"""`python -m stepserve.cli ...`: the same as the `stepserve` command."""

import sys

from stepserve.cli import main

sys.exit(main())
