//! A worker that runs while the lock is held and stops the moment it is lost, and a Ctrl-C that
//! stops the worker, then releases the lock within a bounded time.
//!
//! ```text
//! cargo run --example graceful_shutdown --no-default-features -- [BOOTSTRAP] [LOCK]
//! ```
//!
//! The worker gets a [`HoldWatch`]: cloneable and `Send`, it lets a spawned task see the lease and
//! await the loss without owning the guard. The guard stays with `main`, which releases it.

use std::future::Future;
use std::time::Duration;

use kafka_lock::{HoldWatch, LockOptions, Release};
use tokio::sync::oneshot;

/// Works in small steps until told to stop or until the lock is lost, and says which.
async fn worker(watch: HoldWatch, mut stop: oneshot::Receiver<()>) -> &'static str {
    let mut step = 0u64;
    loop {
        tokio::select! {
            _ = &mut stop => return "asked to stop",
            why = watch.lost() => {
                eprintln!("worker: lost the lock ({why}); stopping at once");
                return "lost the lock";
            }
            () = tokio::time::sleep(Duration::from_millis(500)) => {
                // Checked before each step as well: a step must not start once the lease is
                // over, even if the loss has not been reported yet.
                if !watch.is_held() {
                    return "lease over";
                }
                step += 1;
                println!("worker: step {step}");
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let bootstrap = args.next().unwrap_or_else(|| "127.0.0.1:9092".to_owned());
    let name = args
        .next()
        .unwrap_or_else(|| "kafka-lock-shutdown-example".to_owned());
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
        println!("Ctrl-C: stopping the worker");
    };
    let (ended, release) = run(&bootstrap, &name, ctrl_c).await?;
    println!("worker ended: {ended}; released: {release:?}");
    Ok(())
}

/// Holds the lock and runs the worker until `shutdown` resolves or the lock is lost, then
/// releases. Returns how the worker ended and how the release did. (The integration tests run
/// this against their brokers.)
pub async fn run(
    bootstrap: &str,
    name: &str,
    shutdown: impl Future<Output = ()>,
) -> Result<(&'static str, Release), Box<dyn std::error::Error>> {
    let guard = LockOptions::new(bootstrap, name)
        // How long release() waits for the coordinator to confirm the leave.
        .leave_timeout(Duration::from_secs(2))
        .acquire(None)
        .await?;
    println!(
        "holding {name:?} with token {}; Ctrl-C to stop",
        guard.token()
    );

    let (stop, stopped) = oneshot::channel();
    let mut work = tokio::spawn(worker(guard.watch(), stopped));
    let ended = tokio::select! {
        () = shutdown => {
            let _ = stop.send(());
            work.await?
        }
        r = &mut work => r?,
    };

    // Within the leave timeout whatever the coordinator does; the hold itself has ended before
    // the LeaveGroup is even sent.
    let release = guard.release().await?;
    Ok((ended, release))
}
