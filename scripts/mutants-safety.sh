#!/usr/bin/env bash
# Mutation testing of the safety scope: every file whose breakage could let a holder act after
# the broker may have moved on, each against the tests that can catch its mutants (lib tests
# where they suffice, the CLI's unit tests and a subset of the integration tests where they do
# not). docs/testing.md, "Mutation testing", has the results and what each run costs.
#
#   scripts/mutants-safety.sh                     # the whole scope, file by file (many hours)
#   scripts/mutants-safety.sh src/membership.rs   # one or more files of the scope
#   SHARD=0/4 scripts/mutants-safety.sh src/ledger/mod.rs   # a round-robin quarter of a file
#   LIST=1 scripts/mutants-safety.sh              # only count the mutants per file
#   TIMEOUT=120 NICE=19 scripts/mutants-safety.sh ...   # test timeout per mutant (default 90 s)
#   LIB_ONLY=1 scripts/mutants-safety.sh src/driver/pool.rs      # its lib tests only, no brokers
#   LIB_ONLY=1 scripts/mutants-safety.sh src/lock.rs   # lib and scripted-broker tests, no JVM
#   BIN_ONLY=1 scripts/mutants-safety.sh src/bin/kafka-lock/tree.rs  # the CLI's unit tests only
#                                                 # (tree.rs runs only so: see `selection`)
#   ITERATE=1 scripts/mutants-safety.sh src/membership.rs  # resume: skip the caught and unviable
#   RE='^src/membership\.rs:(14[7-9][0-9]|1[5-9][0-9][0-9]):' scripts/mutants-safety.sh src/membership.rs
#                                                 # only the mutants whose names match (`--list`)
#   CLI_IT_ONLY='cli::supervisor_' RE='...' scripts/mutants-safety.sh src/bin/kafka-lock/supervise.rs
#                                                 # the CLI's rows against these tests/it filters
#                                                 # (space-separated) instead of the seven below
#
# Results go to target/mutants-safety/<file>/mutants.out (outcomes.json, caught.txt,
# missed.txt, timeout.txt, unviable.txt); a second run over the same file moves them to
# mutants.out.old, so copy them aside first. With ITERATE, a run (or a stopped one) goes on where
# the last left off: the mutants caught or unviable there are skipped, the missed ones, those
# that timed out and those not reached are run. Not run by CI or scripts/test.sh: too slow.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# cargo-mutants builds in a copy of the tree without the ignored .tools: the tests find the
# brokers and Python through these instead.
export KAFKA_LOCK_TANSU=${KAFKA_LOCK_TANSU:-$root/.tools/bin/tansu}
export KAFKA_LOCK_PYTHON=${KAFKA_LOCK_PYTHON:-$root/.tools/venv/bin/python}
export KAFKA_LOCK_KAFKA_LIBS=${KAFKA_LOCK_KAFKA_LIBS:-$root/.tools/kafka/libs}
# A target directory of its own, so that the mutants' builds and ordinary builds of the tree do
# not wait for each other's lock on it. It starts as a copy of the tree's debug build: the
# dependencies are then reused (the scratch copy's own crate builds apart, under its own path)
# instead of being compiled again for every run.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/mutants-safety-build}
if [ ! -d "$CARGO_TARGET_DIR/debug" ] && [ -d "$root/target/debug" ]; then
    mkdir -p "$CARGO_TARGET_DIR/debug"
    (cd "$root/target/debug" && tar cf - --exclude=./incremental .) | (cd "$CARGO_TARGET_DIR/debug" && tar xf -)
fi

SCOPE=(
    src/membership.rs
    src/ledger/mod.rs
    src/assign/native.rs
    src/assign/consumer.rs
    src/lock.rs
    src/driver/ledger.rs
    src/driver/pool.rs
    src/driver/session.rs
    src/bin/kafka-lock/hold.rs
    src/bin/kafka-lock/run.rs
    src/bin/kafka-lock/link.rs
    src/bin/kafka-lock/supervise.rs
    src/bin/kafka-lock/tree.rs
)

# The integration tests that exercise each file where unit tests cannot, chosen to keep one
# mutant under a few minutes on two cores. Names are test-name filters of tests/it.
LOCK_IT=(
    lock::try_acquire_is_prompt_both_ways::apache
    lock::release_hands_the_lock_to_a_waiter::apache
    lock::newly_joining_waiters_never_take_the_lock_from_the_holder::apache
    failover::
)
LEDGER_IT=(
    ledger::a_stale_holders_checkpoint_is_rejected_by_the_broker
    ledger::waiters_learn_of_a_release_from_the_ledger_at_once
    ledger::a_ledger_topic_with_two_partitions_is_refused
    ledger::scripted::a_holds_checkpoint_read_opens_no_connection_and_looks_nothing_up
)
# The session task between a lock and its machines, through whole locks on scripted
# coordinators: a checkpoint in a rebalance, a held commit, events, the checkpoint read.
SESSION_IT=(
    parked::
    ledger::scripted::
)
CLI_IT=(
    cli::the_command_is_stopped_when_the_lease_runs_out_and_kafka_lock_exits_74
    cli::a_command_that_ignores_sigterm_is_killed_after_the_grace
    cli::a_stopped_kafka_lock_cannot_keep_its_command_running_past_the_lease
    cli::killing_kafka_lock_stops_everything_the_command_started
    cli::what_an_exited_command_left_running_is_stopped_before_the_release
    cli::a_dead_supervisor_is_replaced_by_kafka_lock_stopping_everything_then_releasing
    cli::supervisor_
)
# The tests of tests/it that start no broker: whole locks on the scripted coordinators of
# fake_broker (held requests, the ledger's reads beside the join, a connection lost in the topic
# check, and the client's admission of many acquisitions). Every other module of tests/it, and
# the rest of many_locks, starts Apache Kafka. The first stage of src/lock.rs and
# src/driver/ledger.rs (LIB_ONLY) runs these with the lib's scripted tests: seconds per mutant,
# so that only its survivors need the minutes of the Apache tests above.
SCRIPTED_IT=(
    parked::
    ledger::scripted::
    regressions::
    many_locks::acquisitions_through_one_client_open_a_handful_of_connections
    many_locks::a_burst_of_acquisitions_through_a_client_runs_in_waves
    many_locks::an_acquisition_held_in_its_join_gives_its_place_up_after_its_time
    many_locks::a_cancelled_acquisition_gives_its_place_back_at_once
    many_locks::an_acquisition_checking_its_topic_gives_its_place_up_after_its_time
    many_locks::a_holders_rejoin_does_not_wait_for_an_admission_place
)
# The lib's tests that reach the lock and the driver: the lock's own, the driver over a scripted
# broker, the ledger machine. Not `ledger::`, which in tests/it names Apache tests too.
LOCK_LIB=(
    lock::tests::
    driver::
    ledger::tests::
)
# The `cli::supervisor_` tests drive the supervisor over its socket and start no broker: seconds
# per mutant instead of minutes, so a run may narrow the row to them (or to any other filters).
if [ -n "${CLI_IT_ONLY:-}" ]; then
    read -r -a CLI_IT <<<"$CLI_IT_ONLY"
fi

# The tests of one file: `cargo test` arguments, then test-name filters.
test_args() {
    local a
    for a in "$@"; do printf -- '--cargo-test-arg=%s ' "$a"; done
}

# Prints the cargo-mutants arguments that select the features, targets and tests for one file.
# A mutant is only ever run against fewer tests than the whole suite, so a narrow selection can
# make a mutant look missed, never make it look caught.
selection() {
    case "$1" in
    src/membership.rs)
        # The sans-I/O machines: their unit tests are the reference, with those of the modules
        # that drive them (the ledger machine, the lock, the driver over a scripted broker). No
        # features: none of these tests is behind one, and the build is smaller. The rest of the
        # lib tests (the wire, config, proptests of the assignors) take most of the lib's
        # seconds and do not reach this code.
        echo "--no-default-features --cargo-arg=--lib $(test_args -- membership:: ledger:: lock:: driver::)"
        ;;
    src/ledger/mod.rs)
        echo "--no-default-features --cargo-arg=--lib $(test_args -- ledger:: lock:: driver:: election:: describe::)"
        ;;
    src/assign/native.rs | src/assign/consumer.rs)
        echo "--no-default-features --cargo-arg=--lib $(test_args -- assign:: membership:: lock:: driver::)"
        ;;
    src/lock.rs | src/driver/ledger.rs)
        # LIB_ONLY: the broker-free first stage (LOCK_LIB and SCRIPTED_IT); its survivors then
        # run against the Apache tests with RE= (docs/testing.md, "Seventh round").
        # The scripted tests spend their seconds waiting on their brokers' timers (two of them
        # 10 s each), not computing: more threads than cores take a mutant's tests from about
        # 36 s to about 16 s here (TEST_THREADS=2: the default on two cores).
        if [ -n "${LIB_ONLY:-}" ]; then
            echo "--all-features --cargo-arg=--lib --cargo-arg=--test=it $(test_args -- "--test-threads=${TEST_THREADS:-8}" "${LOCK_LIB[@]}" "${SCRIPTED_IT[@]}")"
        elif [ "$1" = src/lock.rs ]; then
            echo "--all-features --cargo-arg=--lib --cargo-arg=--test=it $(test_args -- lock::tests:: "${LOCK_IT[@]}")"
        else
            echo "--all-features --cargo-arg=--lib --cargo-arg=--test=it $(test_args -- ledger:: "${LEDGER_IT[@]}")"
        fi
        ;;
    src/driver/pool.rs)
        # Which connection a renewal waits for: the scripted-broker driver tests, then (unless
        # LIB_ONLY is set) the many-locks tests on Apache.
        if [ -n "${LIB_ONLY:-}" ]; then
            echo "--all-features --cargo-arg=--lib $(test_args -- driver:: lock::)"
        else
            echo "--all-features --cargo-arg=--lib --cargo-arg=--test=it $(test_args -- driver:: lock:: many_locks::)"
        fi
        ;;
    src/driver/session.rs)
        # The lib's scripted-broker and machine tests (`ledger::tests::`, `lock::tests::`: not
        # the Apache tests of tests/it that the same names would match), then whole locks on
        # the scripted coordinators of tests/it, which start no broker.
        echo "--all-features --cargo-arg=--lib --cargo-arg=--test=it $(test_args -- driver:: ledger::tests:: lock::tests:: "${SESSION_IT[@]}")"
        ;;
    src/bin/kafka-lock/hold.rs)
        # The hold's machine is sans-I/O: its scripted tests are the reference.
        echo "--cargo-arg=--bin=kafka-lock $(test_args -- hold::)"
        ;;
    src/bin/kafka-lock/tree.rs)
        # Only the CLI's unit tests, which stop real process trees inside a PID namespace of
        # their own. Against tests/it, a mutant of the walk that finds the descendants (one
        # that keeps every process /proc lists) would have the supervisor signal every process
        # of the host that this user may signal.
        if [ -z "${BIN_ONLY:-}" ] && [ -z "${LIST:-}" ]; then
            echo "$1 runs with BIN_ONLY=1 only: its mutants can make the supervisor signal every process of the host" >&2
            return 1
        fi
        echo "--all-features --cargo-arg=--bin=kafka-lock $(test_args -- run:: link:: supervise:: tree::)"
        ;;
    src/bin/kafka-lock/*)
        # The CLI's unit tests, then (unless BIN_ONLY is set) the integration tests above, which
        # start Apache Kafka and real commands: minutes per mutant instead of seconds.
        if [ -n "${BIN_ONLY:-}" ]; then
            echo "--all-features --cargo-arg=--bin=kafka-lock $(test_args -- run:: link:: supervise:: tree::)"
        else
            echo "--all-features --cargo-arg=--bin=kafka-lock --cargo-arg=--test=it $(test_args -- run:: link:: supervise:: tree:: "${CLI_IT[@]}")"
        fi
        ;;
    *)
        echo "$1 is not in the safety scope: ${SCOPE[*]}" >&2
        return 1
        ;;
    esac
}

files=("$@")
[ ${#files[@]} -gt 0 ] || files=("${SCOPE[@]}")
for f in "${files[@]}"; do
    args=$(selection "$f")
    out="$root/target/mutants-safety/$(printf '%s' "$f" | tr / _)"
    mkdir -p "$out"
    common=(--config "$root/.cargo/mutants-safety.toml" --file "$f" --output "$out")
    if [ -n "${LIST:-}" ]; then
        printf '%s\t' "$f"
        # shellcheck disable=SC2086
        cargo mutants "${common[@]}" --list | wc -l
        continue
    fi
    extra=()
    [ -z "${SHARD:-}" ] || extra=(--shard "$SHARD" --sharding round-robin)
    [ -z "${ITERATE:-}" ] || extra+=(--iterate)
    [ -z "${RE:-}" ] || extra+=(--re "$RE")
    echo "== $f (${SHARD:-all})" >&2
    # A timeout counts as caught, and a passing run cut short by a loaded machine would be a
    # false catch: the default is several times what a mutant's tests take here under load.
    # shellcheck disable=SC2086
    nice -n "${NICE:-15}" cargo mutants -j 1 --timeout "${TIMEOUT:-90}" "${common[@]}" "${extra[@]}" $args || true
done
