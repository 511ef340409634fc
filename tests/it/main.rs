//! Integration tests: one test binary, so every test shares one real broker (see `support`).

mod apache;
mod cli;
mod compose;
mod coordinator_failover;
mod failover;
mod golden;
mod interop;
mod java_peers;
mod lock;
mod proxy;
mod support;
mod wire_broker;
