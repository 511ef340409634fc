"""The seed design's lock, on librdkafka (confluent-kafka): a consumer on a one-partition topic
holds the lock while partition 0 is assigned to it.

Usage: rdkafka_lock.py BOOTSTRAP GROUP TOPIC CLIENT_ID [SESSION_MS] [HEARTBEAT_MS]

Prints one JSON object per line on stdout: {"event": "assigned"|"revoked"|"lost"|"closed",
"partitions": [...], "mono_ns": CLOCK_MONOTONIC}. Reads stdin; the line "close" (or end of input)
closes the consumer, which sends LeaveGroup.
"""

import json
import sys
import threading
import time

from confluent_kafka import Consumer


def mono_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def emit(event, **fields):
    print(json.dumps({"event": event, "mono_ns": mono_ns(), **fields}), flush=True)


def main():
    bootstrap, group, topic, client_id = sys.argv[1:5]
    session_ms = int(sys.argv[5]) if len(sys.argv) > 5 else 6000
    heartbeat_ms = int(sys.argv[6]) if len(sys.argv) > 6 else 500
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": client_id,
            "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": heartbeat_ms,
            "enable.auto.commit": False,
            "partition.assignment.strategy": "range",
        }
    )

    def parts(ps):
        return sorted(p.partition for p in ps)

    consumer.subscribe(
        [topic],
        on_assign=lambda c, ps: emit("assigned", partitions=parts(ps)),
        on_revoke=lambda c, ps: emit("revoked", partitions=parts(ps)),
        on_lost=lambda c, ps: emit("lost", partitions=parts(ps)),
    )
    stop = threading.Event()

    def watch_stdin():
        for line in sys.stdin:
            if line.strip() == "close":
                break
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    emit("started")
    while not stop.is_set():
        consumer.poll(0.05)
    consumer.close()
    emit("closed")


if __name__ == "__main__":
    main()
