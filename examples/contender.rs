//! A lock contender driven over stdin/stdout, for benchmarks that put kafka-lock side by side with
//! other clients (bench/lock_bench.py drives the librdkafka twin, tests/interop/rdkafka_lock.py).
//!
//! ```text
//! contender BOOTSTRAP LOCK [--topic T] [--session-ms N] [--heartbeat-ms N]
//!           [--ledger-topic T] [--push on|off] [--also-hold N]
//! ```
//!
//! `--also-hold N` first takes N other locks (`LOCK-bg<pid>-<i>`, heartbeat 3 s, session 10 s,
//! as `examples/many_locks.rs`) through one `Client` and keeps them, then contends for LOCK
//! through the same client: a handover next to many held locks.
//!
//! Prints one JSON object per line: `started`, `waiting`, `acquired`, `renewed` (a heartbeat moved
//! the lease end), `lost`, `released`, `closed`, each with `mono_ns` (CLOCK_MONOTONIC). The stdin
//! line `close` (or end of input) releases and exits.

use std::time::Duration;

use kafka_lock::{Client, LockEvent, LockOptions};
use tokio::io::{AsyncBufReadExt, BufReader};

/// CLOCK_MONOTONIC in nanoseconds: comparable between processes on one host, unlike the
/// opaque `std::time::Instant`.
fn mono_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass.
    #[allow(unsafe_code)]
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

fn emit(event: &str, extra: &str) {
    println!(
        "{{\"event\": \"{event}\", \"mono_ns\": {}{extra}}}",
        mono_ns()
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!(
            "usage: contender BOOTSTRAP LOCK [--topic T] [--session-ms N] [--heartbeat-ms N] \
             [--ledger-topic T] [--push on|off] [--also-hold N]"
        );
        std::process::exit(64);
    }
    let also_hold: usize = args
        .iter()
        .position(|a| a == "--also-hold")
        .and_then(|i| args.get(i + 1))
        .map_or(0, |n| n.parse().expect("--also-hold takes a number"));
    // Kept for as long as the process runs; dropping them would let the locks go.
    let mut background = Vec::new();
    let mut opts = if also_hold > 0 {
        let client = Client::new(&args[0]);
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..also_hold {
            let lock = client
                .lock(format!("{}-bg{}-{i}", args[1], std::process::id()))
                .session_timeout(Duration::from_secs(10))
                .rebalance_timeout(Duration::from_secs(10))
                .heartbeat_interval(Duration::from_secs(3));
            tasks.spawn(async move { lock.acquire(Some(Duration::from_secs(120))).await });
        }
        while let Some(r) = tasks.join_next().await {
            match r.expect("an acquisition task") {
                Ok(g) => background.push(g),
                Err(e) => {
                    eprintln!("contender: a background lock: {e}");
                    std::process::exit(1);
                }
            }
        }
        emit("background", &format!(", \"held\": {}", background.len()));
        client.lock(args[1].clone())
    } else {
        LockOptions::new(&args[0], args[1].clone())
    };
    let mut rest = args[2..].iter();
    while let Some(flag) = rest.next() {
        let value = rest.next().unwrap_or_else(|| {
            eprintln!("{flag} needs a value");
            std::process::exit(64)
        });
        let ms = || Duration::from_millis(value.parse().expect("milliseconds"));
        opts = match flag.as_str() {
            "--topic" => opts.consumer_topic(value),
            "--session-ms" => opts.session_timeout(ms()).rebalance_timeout(ms()),
            "--heartbeat-ms" => opts.heartbeat_interval(ms()),
            "--ledger-topic" => opts.ledger_topic(value),
            "--push" => opts.ledger_push(value == "on"),
            "--also-hold" => opts,
            other => {
                eprintln!("unknown flag {other}");
                std::process::exit(64)
            }
        };
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let opts = opts.events(tx);
    tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            match e {
                LockEvent::Waiting { position, .. } => {
                    emit("waiting", &format!(", \"position\": {position}"))
                }
                LockEvent::Acquired { token, .. } => emit(
                    "acquired",
                    &format!(
                        ", \"token\": {}, \"generation\": {}",
                        token.value(),
                        token.generation
                    ),
                ),
                LockEvent::Lost { reason, .. } => {
                    emit("lost", &format!(", \"reason\": \"{}\"", reason.as_str()))
                }
                LockEvent::Released => emit("released", ""),
                _ => {}
            }
        }
    });
    emit("started", "");
    let guard = match opts.acquire(None).await {
        Ok(g) => g,
        Err(e) => {
            eprintln!("contender: {e}");
            std::process::exit(1);
        }
    };
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut hold = guard.watch();
    loop {
        tokio::select! {
            more = hold.changed() => {
                if !more {
                    break;
                }
                if hold.is_held() {
                    emit("renewed", "");
                }
            }
            line = lines.next_line() => match line {
                Ok(Some(l)) if l.trim() != "close" => continue,
                _ => break,
            },
            reason = guard.lost() => {
                eprintln!("contender: lost the lock: {reason}");
                std::process::exit(74);
            }
        }
    }
    guard.release().await.ok();
    emit("closed", "");
    drop(background);
}
