from localstate.changelog.kafka import KafkaChangelogSystem
from localstate.changelog.kafka.devbroker import DevBroker

with DevBroker() as broker:                                   # throwaway Tansu on a free port
    system = KafkaChangelogSystem({"bootstrap_servers": broker.bootstrap_servers})
    system.ensure_stream("counts", partitions=2)              # creates the compacted topic
    log = system.partition("counts", 0)                       # producer for partition 0 (fences older ones)
    log.append(b"apple", b"3")
    log.append_many([(b"pear", b"1"), (b"apple", None)])      # None = tombstone
    end = log.flush()                                         # acks=all + commit -> 3
    print([(r.offset, r.key, r.value) for r in log.read(0, end)])
    system.close()
