//! Integration tests: one test binary, so every test shares one real broker (see `support`).

mod failover;
mod golden;
mod interop;
mod lock;
mod support;
mod wire_broker;
