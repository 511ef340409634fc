//! Take N distinct locks through one [`Client`], hold them, release them: how many sockets,
//! how much memory and CPU many locks in one process cost (BENCHMARKS.md has the figures).
//!
//! ```text
//! cargo run --release --no-default-features --example many_locks -- BOOTSTRAP N HOLD_SECS [LOCK_PREFIX]
//! ```
//!
//! The locks are `LOCK_PREFIX-0` .. `LOCK_PREFIX-(N-1)` (prefix default `many-locks`), taken all
//! at once with a 3 s heartbeat. It prints exactly two lines: `acquired A of N in S s` once every
//! acquisition has ended (A of them with the lock), and `held at end H of N` after HOLD_SECS,
//! before releasing. `KAFKA_LOCK_LOG=warn` (or `debug`, any `tracing` filter) logs the protocol
//! on stderr. `MANY_LOCKS_QUICK_CONNECTIONS=k` sets `Client::quick_connections`,
//! `MANY_LOCKS_AT_ONCE=k` sets `Client::acquisitions_at_once`. `MANY_LOCKS_WORKER_THREADS=k`
//! runs it on a multi-thread runtime with k workers (default: one per core), and `0` on a
//! `current_thread` runtime: what the runtime's hand-offs between threads cost, apart from
//! the library's own work.

use std::time::{Duration, Instant};

use kafka_lock::Client;

/// How long one acquisition may take before it counts as failed.
const ACQUIRE_WAIT: Duration = Duration::from_secs(600);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "usage: many_locks BOOTSTRAP N HOLD_SECS [LOCK_PREFIX]";
    let runtime = match std::env::var("MANY_LOCKS_WORKER_THREADS") {
        Ok(k) => match k
            .parse()
            .map_err(|_| "MANY_LOCKS_WORKER_THREADS: a number")?
        {
            0 => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            k => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(k)
                .enable_all()
                .build()?,
        },
        Err(_) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?,
    };
    runtime.block_on(run(usage))
}

async fn run(usage: &str) -> Result<(), Box<dyn std::error::Error>> {
    if let Ok(filter) = std::env::var("KAFKA_LOCK_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let mut args = std::env::args().skip(1);
    let bootstrap = args.next().ok_or(usage)?;
    let n: usize = args.next().ok_or(usage)?.parse().map_err(|_| usage)?;
    let hold: u64 = args.next().ok_or(usage)?.parse().map_err(|_| usage)?;
    let prefix = args.next().unwrap_or_else(|| "many-locks".to_owned());

    let mut client = Client::new(&bootstrap);
    // The quick connections per broker (`Client::quick_connections`), default if unset.
    if let Ok(k) = std::env::var("MANY_LOCKS_QUICK_CONNECTIONS") {
        client = client.quick_connections(k.parse().map_err(|_| usage)?);
    }
    // The acquisitions at once (`Client::acquisitions_at_once`), default if unset.
    if let Ok(k) = std::env::var("MANY_LOCKS_AT_ONCE") {
        client = client.acquisitions_at_once(k.parse().map_err(|_| usage)?);
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let lock = client
            .lock(format!("{prefix}-{i}"))
            .label("examples/many_locks.rs")
            .heartbeat_interval(Duration::from_secs(3));
        tasks.spawn(async move {
            match tokio::time::timeout(ACQUIRE_WAIT, lock.acquire(None)).await {
                Ok(Ok(guard)) => Some(guard),
                Ok(Err(e)) => {
                    eprintln!("{}: {e}", lock.name());
                    None
                }
                Err(_) => {
                    eprintln!("{}: not acquired within {ACQUIRE_WAIT:?}", lock.name());
                    None
                }
            }
        });
    }
    let mut guards = Vec::with_capacity(n);
    while let Some(joined) = tasks.join_next().await {
        if let Some(guard) = joined? {
            guards.push(guard);
        }
    }
    println!(
        "acquired {} of {n} in {:.2} s",
        guards.len(),
        started.elapsed().as_secs_f64()
    );

    tokio::time::sleep(Duration::from_secs(hold)).await;
    let held = guards.iter().filter(|g| g.is_held()).count();
    println!("held at end {held} of {n}");

    let mut releases = tokio::task::JoinSet::new();
    for guard in guards {
        releases.spawn(guard.release());
    }
    while let Some(r) = releases.join_next().await {
        if let Err(e) = r? {
            eprintln!("release: {e}");
        }
    }
    Ok(())
}
