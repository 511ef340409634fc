//! Integration tests: one test binary, so every test shares one real broker (see `support`).

mod cli;
mod compose;
mod failover;
mod fake_broker;
mod golden;
mod interop;
mod java_peers;
mod ledger;
mod lock;
mod proxy;
mod support;
mod wire_broker;
