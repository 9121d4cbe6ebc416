"""What runs one task partition, on any host: :class:`~.instance.TaskInstance` and its parts.

* :mod:`.instance`: one live task partition, composed of the parts below (released whatever fails: :mod:`.release`);
* :mod:`.stores`: its store set: open, recover to the checkpoint, attempt markers, flush, the
  checkpoint's store fields (what Kafka Streams' ``ProcessorStateManager`` does);
* :mod:`.recovery`: bringing one store partition back to exactly a checkpoint;
* :mod:`.feeder`: the one feed loop (records, Arrow batches and column chunks through one path),
  with its parts in :mod:`.records` (bad-record policies, feed counts, row containers);
* :mod:`.committer`: when to commit, and the pipelined-commit thread;
* :mod:`.timers`: the partition's watermark, clock and timers;
* :mod:`.lifecycle`: :class:`~.lifecycle.PartitionTask`, the steps of one batch (or one in-process
  run) from open to check-in, which every runtime and the TaskTestDriver drive;
* :mod:`.sink`: where committed outputs go;
* :mod:`.faults`: crash points for fault injection.

Nothing here imports the driver's operations (:mod:`localstate.runtime.driver`) or Spark
(:mod:`localstate.runtime.spark`).
"""

__all__: list[str] = []
