//! Integration tests: one test binary, so every test shares one real broker (see `support`).

mod apache;
mod cli;
mod compose;
mod coordinator_failover;
mod election;
mod examples;
mod failover;
mod fake_broker;
mod fault;
mod golden;
mod interop;
mod java_peers;
mod ledger;
mod lock;
mod many_locks;
mod oauth;
mod parked;
mod proxy;
mod regressions;
mod security;
mod semaphore;
mod support;
mod wire_broker;
