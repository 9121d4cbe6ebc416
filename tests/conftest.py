"""Project-wide test setup."""

import os

# The test-only switch that arms fault-injection hooks (LOCALSTATE_CRASH_AT, see
# localstate.core.faults). Set here, before any test starts a child process or Spark, so the
# children inherit it; production environments never set it.
os.environ["LOCALSTATE_TESTING"] = "1"
