//! Take a lock, do some work while holding it, release it, and say how the release ended.
//!
//! ```text
//! cargo run --example basic --no-default-features -- [BOOTSTRAP] [LOCK]
//! ```
//!
//! BOOTSTRAP defaults to 127.0.0.1:9092 and LOCK to `kafka-lock-example`. Run two at once to see
//! the second wait for the first.

use std::time::Duration;

use kafka_lock::{LockOptions, Release};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let bootstrap = args.next().unwrap_or_else(|| "127.0.0.1:9092".to_owned());
    let name = args
        .next()
        .unwrap_or_else(|| "kafka-lock-example".to_owned());
    match run(&bootstrap, &name).await? {
        Release::Confirmed => println!("released; the coordinator confirmed the leave"),
        Release::Unconfirmed => println!(
            "released, but the coordinator did not confirm the leave in time; a waiter may have \
             to wait for this member's session to time out"
        ),
        other => println!("released: {other:?}"),
    }
    Ok(())
}

/// Takes the lock, works, releases. (The integration tests run this against their brokers.)
pub async fn run(bootstrap: &str, name: &str) -> Result<Release, Box<dyn std::error::Error>> {
    // Wait up to 30 s for the lock; Error::NotAcquired if someone else keeps it that long.
    let guard = LockOptions::new(bootstrap, name)
        .label("examples/basic.rs")
        .acquire(Some(Duration::from_secs(30)))
        .await?;
    println!("holding {name:?} with fencing token {}", guard.token());

    // The work. It stops as soon as the lock is lost: past that point another process may hold
    // the lock, and only the fencing token can keep our late writes out.
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(1)) => println!("work done"),
        why = guard.lost() => return Err(format!("lost the lock: {why}").into()),
    }

    Ok(guard.release().await?)
}
