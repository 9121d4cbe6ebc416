"""``python -m localstate``: the same as the ``localstate`` command."""

import sys

from localstate.core.cli import main

sys.exit(main())
