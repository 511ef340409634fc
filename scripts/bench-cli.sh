#!/usr/bin/env bash
# The CLI side by side with `etcdctl lock` (acquire, handover, failover; BENCHMARKS.md, "The CLI
# next to etcdctl lock"). Builds the release binary, installs etcd from Debian's packages when it
# is missing (etcd is left out, with a message, when that is not possible), starts its own Apache
# Kafka and etcd on loopback and stops every process on exit.
#
#   scripts/bench-cli.sh                 # 10 rounds of each
#   scripts/bench-cli.sh --rounds 3      # a quick check; its numbers are not results
#   scripts/bench-cli.sh --only handover --json handover.json
#   scripts/bench-cli.sh --trace acquire # one uncontended acquire of each, taken apart the same way
#   scripts/bench-cli.sh --trace         # one handover of each kafka-lock variant taken apart:
#                                        # the steps of both processes, stamped, and their requests
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "installing etcd-server and etcd-client (apt-get)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server etcd-client >&2 \
            || echo "apt-get could not install etcd: the table leaves it out" >&2
    elif command -v apt-get >/dev/null && command -v sudo >/dev/null; then
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server etcd-client >&2 \
            || echo "apt-get could not install etcd: the table leaves it out" >&2
    else
        echo "no etcd and no way to install it (apt-get as root or with sudo): the table leaves it out" >&2
    fi
fi

cargo build --release --features cli --bin kafka-lock >&2
exec python3 scripts/bench_cli.py "$@"
