"""The contract: what a task author and a plugin author import, and nothing that runs a job.

* the task API (:mod:`.task`) and time (:mod:`.time`: domains, watermark, timers, the ``[time]`` table);
* the engine contract (:mod:`.engine`), the logged-store layer engines build on (:mod:`.logged`)
  and the storage backend contract (:mod:`.backend`);
* the changelog contract (:mod:`.changelog`), the stream-system contract for job inputs and outputs
  (:mod:`.stream`) and checkpoints (:mod:`.checkpoint`);
* serdes (:mod:`.serdes`, with the fast codecs of :mod:`.codecs`), options (:mod:`.options`), the job
  config (:mod:`.config`, read with :mod:`.tomlfile`), the plugin registry and its policy
  (:mod:`.registry`, :mod:`.policy`), the partitioner (:mod:`.partitioner`);
* what every plugin shares for safety: symlink-safe paths (:mod:`.names`, :mod:`.fsutil`), damaged
  local state (:mod:`.corruption`), task errors that point at the user's frame (:mod:`.tracebacks`).

Running a job is :mod:`localstate.runtime`'s business; nothing here imports it.
"""

__all__: list[str] = []
