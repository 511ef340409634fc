//! Integration tests: one test binary, so every test shares one real broker (see `support`).

mod golden;
mod support;
