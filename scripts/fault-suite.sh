#!/usr/bin/env bash
# The fault-injection safety suite on Apache Kafka (tests/it/fault, RELIABILITY.md).
#
#   scripts/fault-suite.sh [--long] [--seed N] [--episodes N] [--permits N] [--kinds a,b]
#                          [--many N] [--slow-consumer] [--[no-]checkpoints]
#
# Without --long: the CI mode (every nemesis once, about 170 s), the same test that
# scripts/test.sh runs. With --long: 200 episodes of nemeses drawn at random (about 30 minutes),
# the run behind RELIABILITY.md. A seed replays the same schedule of faults; without one the
# run picks and prints a seed. Either mode fails on any overlapping hold, accepted stale
# write or token inversion, end report with no open hold, or held Heartbeat answer abandoned,
# and if the checker does not catch a contender that ignores its loss. The report, every event
# and write, and every contender's log are kept in target/fault-suite/.
# --permits N (N > 1) makes the native lock a semaphore of N permits (its tokens are ledger
# offsets, as the mutex's); the checker then also fails on more than N holders at once and
# judges overlaps, stale writes and token order per permit slot.
# --kinds a,b draws only those nemeses (names as in RELIABILITY.md, e.g. stall-join); the
# optional ones only so: hold-heartbeat, noexec-loss and runtime-stall (each brings its own
# contender; CI mode runs runtime-stall once, last), pair (two nemeses at different targets at
# once), handover-move (the coordinator killed or shut down at a holder's release),
# ledger-forger (records naming the current hold appended to the ledger by another producer),
# cut-ledger (links to the ledger partition's leader cut, at a grant or while waiters poll) and
# lane-starvation (the many-locks contenders on one parking lane while holders are killed),
# handover-ledger-move (the ledger partition's leader killed or shut down at a holder's
# release) and abandoned-polls (the waiters' long-poll answers held, or their links to the
# ledger leader black-holed, at a release), and coord-move-at-grant (a checkpoint's answer
# held, the coordinator shut down with the third replica stopped 1 to 2 s, plain reads at the
# new leader reported); these three turn --checkpoints on.
# slow-ledger-check (at a release, the answers to the ledger topic checks' DescribeConfigs held,
# some contenders signalled mid-check; a JoinGroup before a check's answer fails the run).
# slow-supervisor-start (the CLI contenders' start of their supervisor held back 0.2 to 4 s or
# failed by tests/it/slow_spawn.c, built with cc; new kafka-locks killed or stopped mid-start).
# --many N (N > 1) adds two contender processes that each take the native lock and the same
# N-1 other locks through one client, so the faults hit connections many locks share; the
# checker judges every lock on its own.
# --slow-consumer adds a contender that never reads its lock's events stream.
# --checkpoints makes the native lock's contenders store checkpoints while they hold and read
# the last one at their grant (on by default in CI mode; --no-checkpoints turns it off); the
# run then also fails if a new holder read a checkpoint older than one reported stored before
# its grant, or one was reported stored after its holder's token was fenced off.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() { sed -n '4,40p' "$0" | sed 's/^# \{0,1\}//'; }

test=fault::suite_ci
ignored=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --long) test=fault::suite_long; ignored=(--ignored) ;;
        --seed) export KAFKA_LOCK_FAULT_SEED=${2:?--seed needs a number}; shift ;;
        --episodes) export KAFKA_LOCK_FAULT_EPISODES=${2:?--episodes needs a number}; shift ;;
        --permits) export KAFKA_LOCK_FAULT_PERMITS=${2:?--permits needs a number}; shift ;;
        --kinds) export KAFKA_LOCK_FAULT_KINDS=${2:?--kinds needs nemesis names}; shift ;;
        --many) export KAFKA_LOCK_FAULT_MANY=${2:?--many needs a number}; shift ;;
        --slow-consumer) export KAFKA_LOCK_FAULT_SLOW_CONSUMER=1 ;;
        --checkpoints) export KAFKA_LOCK_FAULT_CHECKPOINTS=1 ;;
        --no-checkpoints) export KAFKA_LOCK_FAULT_CHECKPOINTS=0 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 64 ;;
    esac
    shift
done

scripts/install-test-deps.sh
exec cargo test --all-features --test it -- "$test" --exact --nocapture "${ignored[@]}"
