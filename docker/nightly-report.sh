#!/bin/sh
# The example job: it stands in for tonight's report that must never run twice at once. It starts
# only once `kafka-lock run` holds the lock, and reads the fencing token from its environment; a
# real job passes the token along with every write, so a store can refuse writes from a holder
# that has lost the lock without knowing it.
set -eu

now() { date -u +%H:%M:%S; }

# kafka-lock sends SIGTERM to the job's whole process group when the lock is lost or the container
# is stopped. `sleep` gets it too, so the trap runs at once.
trap 'echo "$(now) nightly-report: stopping (lock lost or container stopped)"; exit 143' TERM INT

echo "$(now) nightly-report: starting; lock $KAFKA_LOCK_NAME, member $KAFKA_LOCK_MEMBER_ID, fencing token $KAFKA_LOCK_TOKEN"
sleep "${JOB_SECONDS:-20}" &
wait $!
echo "$(now) nightly-report: done (token $KAFKA_LOCK_TOKEN)"
