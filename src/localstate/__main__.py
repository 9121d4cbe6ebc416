"""``python -m localstate``: the same as the ``localstate`` command."""

import sys

from localstate.tools.cli import main

sys.exit(main())
