"""`python -m cli`: the `clinical-sync` command."""

import sys

from cli.main import main

sys.exit(main())
