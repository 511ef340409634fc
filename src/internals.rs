//! The one door to the crate's internals, for what lives outside the library but must reach
//! inside it: the integration tests (tests/it), the fuzz targets (fuzz/), the decoding benchmark
//! (benches/decode.rs) and a few needs of the `kafka-lock` binary. Hidden from the docs and **not
//! part of the stable API**: anything here may change or go in any release.
//!
//! Every module of the library is private; this file names, item by item, what outside code may
//! touch, under the path of the module that defines it (`internals::wire::records::RecordBatch`
//! is `crate::wire::records::RecordBatch`). An internal item that nothing here names and nothing
//! inside uses is dead code, and the compiler says so.

/// Settings plumbing of the binary: `KAFKA_LOCK_X_*` variables name keys (`known_keys`), a
/// misspelt one gets a suggestion (`suggest`), and a secret key's variable is not passed on to
/// the command (`is_secret`).
pub mod config {
    pub use crate::config::{is_secret, known_keys, suggest};
}

/// Wire bytes of the native protocol (the binary's `status` tests, the integration tests that
/// join as a raw member, the fuzz targets of peer bytes).
pub mod assign {
    pub use crate::assign::{
        assign_consumer, assign_native, consumer_subscription, decode_consumer_assignment,
        decode_consumer_subscription, fuzz_peer_bytes, ConsumerStrategy, Holder, MemberMetadata,
        NativeAssignment, NATIVE_PROTOCOL, PROTOCOL_TYPE,
    };
}

/// The jitter-free doubling between the binary's `elect` terms, and the tests' retries.
pub mod backoff {
    pub use crate::backoff::Backoff;
}

/// A DescribeGroups answer read as a lock (the binary's `status` tests build one by hand).
pub mod describe {
    pub use crate::group_view::analyse;
}

/// Raw connections, for tests that speak to a broker without a lock.
pub mod driver {
    pub use crate::driver::{connect_any, BootstrapConfig, ConnConfig, Connection};
}

/// The ledger topic's creation command (the binary's `history --help`), its requests and
/// records (tests), and its fuzz entry point.
pub mod ledger {
    pub use crate::ledger::{
        build, compression_fix, create_topic_command, fuzz_ledger_bytes, LedgerRecord, Op,
        RecordKind, SINGLE_BROKER_SETTINGS,
    };
}

/// The sans-I/O wire layer: decoding for the fuzz targets and the benchmark, requests and
/// answers for the tests.
pub mod wire {
    pub use crate::wire::{decode_response, decode_response_frame, Response};

    pub mod codec {
        pub use crate::wire::codec::{
            decode_response, decode_response_bytes, decode_response_frame,
            decode_response_frame_bytes, peek_correlation_id, DecodeError, Response,
        };
    }
    pub mod coordinator {
        pub use crate::wire::coordinator::{
            find_coordinator_request, found_coordinator, FoundCoordinator,
        };
    }
    pub mod frame {
        pub use crate::wire::frame::{decode_frame, frame_length, LENGTH_PREFIX_SIZE};
    }
    pub mod guard {
        pub use crate::wire::guard::{scan_response, AMPLIFICATION_SLACK, MAX_AMPLIFICATION};
    }
    pub mod log {
        pub use crate::wire::log::{produced, TopicPartition};
    }
    pub mod records {
        pub use crate::wire::records::{
            encode_batch, BatchError, Header, NewRecord, Record, RecordBatch, RecordBatches,
            MAX_AMPLIFICATION, MIN_HEADER_SIZE, MIN_RECORD_SIZE,
        };
    }
    pub mod sasl {
        pub use crate::wire::sasl::{
            parse_server_final, parse_server_first, ScramClient, ScramError, ScramHash,
            MAX_ITERATIONS, MIN_ITERATIONS,
        };
    }
    pub mod versions {
        pub use crate::wire::versions::SUPPORTED;
    }
}
