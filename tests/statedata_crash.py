"""Child process of the SIGKILL tests of savepoints, starts from a savepoint and rescales
(tests/statedata/test_crashes.py). Usage:

    python statedata_crash.py savepoint STATE_DIR LOCATION     # a savepoint of the 2-partition model job
    python statedata_crash.py load STATE_DIR LOCATION           # start the job with 3 partitions from it
    python statedata_crash.py rescale STATE_DIR                 # rescale the job from 2 to 3 partitions
    python statedata_crash.py rescale STATE_DIR LOCATION        # the same, by a savepoint kept at LOCATION

With LOCALSTATE_CRASH_AT=point:n (and the test switch LOCALSTATE_TESTING=1) it SIGKILLs itself there.
"""

import sys
from pathlib import Path

from rescale_model import model_job
from localstate.runtime.layout import resolve_epoch
from localstate.runtime.statedata.loader import LoadOptions, load_savepoint
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.reader import Savepoint
from localstate.runtime.statedata.rescale import rescale
from localstate.runtime.statedata.writer import take_savepoint


def main() -> None:
    mode, root = sys.argv[1], Path(sys.argv[2])
    if mode == "savepoint":
        take_savepoint(resolve_epoch(model_job(root, 2)), SavepointLocation({"url": sys.argv[3]}))
    elif mode == "load":
        load_savepoint(Savepoint.open(SavepointLocation({"url": sys.argv[3]})), model_job(root, 3),
                       LoadOptions(yes=True))
    elif mode == "rescale":
        kept = SavepointLocation({"url": sys.argv[3]}) if len(sys.argv) > 3 else None
        rescale(resolve_epoch(model_job(root, 2)), 3, savepoint_to=kept)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
