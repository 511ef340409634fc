#![no_main]

// The checks live in ../targets.rs, shared with the replay test that `cargo test` runs.
#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::sasl_scram(data));
