"""`python -m localserve`: the same command line as the `localserve` script."""

import sys

from localserve.cli import main

sys.exit(main())
