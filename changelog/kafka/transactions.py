"""Two-phase commit of Kafka output transactions (Flink's Kafka sink protocol).

A transactional output leaves each commit's transaction *open* after its records are acknowledged
(pre-commit) and records it in the checkpoint as :func:`recorded` (transactional id, producer id,
epoch). Only once that checkpoint is durable is the transaction committed: by the live producer
when the process that saved the checkpoint holds it, otherwise by :func:`commit_recorded`, which
resumes it from the recorded ids with a raw ``EndTxn`` (the Spark driver after saving a batch's
checkpoints; a partition reopened from a checkpoint that names one). Committing a transaction that
is already committed is harmless (the broker answers a repeated commit of the same epoch with no
error), so every path may commit again; a transaction the broker aborted (timed out, or fenced by a
newer producer with this transactional id) cannot be committed any more: :class:`OutputError`
naming it, never silently lost outputs.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from kafka.errors import for_code
from kafka.protocol.metadata import CoordinatorType
from kafka.protocol.producer.transaction import EndTxnRequest

from localstate.errors import OutputError

from .client import bootstrap_servers, kafka_error
from .io import drop_admin, pooled_admin

__all__ = ["recorded", "commit_recorded", "FENCED"]

log = logging.getLogger(__name__)

FENCED = ("ProducerFencedError", "InvalidProducerEpochError", "InvalidTxnStateError", "TransactionalIdNotFoundError")
"""kafka-python errors meaning: this transaction can no longer be committed by this producer/epoch."""


def recorded(producer: Any, transactional_id: str) -> dict[str, Any]:
    """What a checkpoint records of ``producer``'s open transaction, to commit it from elsewhere."""
    ids = producer._transaction_manager.producer_id_and_epoch  # kafka-python 3.0 keeps them here
    return {"id": transactional_id, "producer_id": int(ids.producer_id), "epoch": int(ids.epoch)}


def commit_recorded(settings: Mapping[str, Any], pending: Mapping[str, Any], *, stream: str, topic: str,
                    partition: int) -> None:
    """Commit the transaction a checkpoint recorded (``pending``: :func:`recorded`), from any
    process. Already committed is fine; one the broker aborted (or cannot confirm) raises an
    OutputError naming the output, its topic, the task partition and the transactional id."""
    tid, producer_id, epoch = pending["id"], pending["producer_id"], pending["epoch"]
    servers = bootstrap_servers(settings)
    where = {"stream": stream, "topic": topic, "partition": partition, "transactional_id": tid}
    try:
        admin = pooled_admin(settings)

        async def end() -> Any:
            node = await admin._find_coordinator_id(tid, CoordinatorType.TRANSACTION)
            return await admin._manager.send(EndTxnRequest(transactional_id=tid, producer_id=producer_id,
                                                           producer_epoch=epoch, committed=True, max_version=3),
                                             node_id=node)

        response = admin._manager.run(end)
        error = for_code(response.error_code)
    except Exception as exc:  # noqa: BLE001 - kafka-python raises many kinds; all become typed
        if "admin" in locals():
            drop_admin(admin)  # a fresh client for the retry
        raise _unconfirmed(kafka_error(exc, f"commit the output transaction {tid!r}", servers, error=OutputError,
                                       **where), tid) from exc
    if error.__name__ == "NoError":
        return
    if error.__name__ in FENCED:
        raise OutputError(
            f"output {stream!r}: the transaction {tid!r} (producer id {producer_id}, epoch {epoch}) that the "
            f"checkpoint of task partition {partition} recorded for topic {topic!r} can no longer be committed "
            f"({error.__name__}): the broker aborted it (it stayed open longer than transaction_timeout, or a "
            f"newer producer with this transactional id took over), so its records are not visible",
            bootstrap_servers=servers, **where,
            hint=f"the state and inputs of this checkpoint already count those records: restore the job from a "
                 f"backup or reset it (`localstate reset`) to produce them again; raise "
                 f"[outputs.{stream}] transaction_timeout (and the broker's transaction.max.timeout.ms) so that "
                 f"a restart after a crash happens within it, and never run two jobs with one "
                 f"transactional_id_prefix and job name")
    raise _unconfirmed(OutputError(f"commit of the output transaction {tid!r} failed ({error.__name__})",
                                   bootstrap_servers=servers, **where), tid)


def _unconfirmed(error: OutputError, tid: str) -> OutputError:
    """An EndTxn that got no clear answer: the transaction is not lost yet, retrying may commit it."""
    return OutputError(error.message, **error.context,
                       hint=f"the checkpoint names the open transaction {tid!r}: restarting the job retries its "
                            f"commit (harmless if it was committed); it must happen within transaction_timeout, "
                            f"after which the broker aborts the transaction. " + (error.hint or ""))
