//! Why the fencing token matters: a store that refuses writes carrying a token lower than the
//! highest it has seen keeps a former holder's late write from overwriting the current holder's.
//!
//! ```text
//! cargo run --example fenced_write --no-default-features -- [BOOTSTRAP] [LOCK] [LEDGER_TOPIC]
//! ```
//!
//! Two holders take the same lock one after the other. The first is slow: it still means to
//! write after the second has taken over, as a process paused by a long GC or a stopped VM would,
//! waking after its lease ran out. The store turns that write away because its token is stale.
//!
//! With LEDGER_TOPIC (an existing topic with one partition) the tokens are ledger offsets, which
//! never go backwards; without, they are group generations, which only grow within one life of
//! the group (see the crate docs).

use std::sync::Mutex;
use std::time::Duration;

use kafka_lock::{FencingToken, LockOptions};

/// The resource the lock protects: here an in-process value; in real life a database row, a
/// file in object storage, a directory... anything that can compare a number on each write.
#[derive(Default)]
struct FencedStore {
    state: Mutex<Stored>,
}

#[derive(Default)]
struct Stored {
    /// The highest token any accepted write carried.
    highest: Option<i64>,
    value: String,
}

impl FencedStore {
    /// Writes `value` unless a write with a higher token was accepted before. Equal tokens are
    /// the same hold writing again.
    fn write(&self, token: &FencingToken, value: &str) -> Result<(), String> {
        let mut s = self.state.lock().unwrap();
        if let Some(highest) = s.highest.filter(|&h| token.value() < h) {
            return Err(format!(
                "stale token {token}: a holder with token {highest} has written since"
            ));
        }
        s.highest = Some(token.value());
        s.value = value.to_owned();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let bootstrap = args.next().unwrap_or_else(|| "127.0.0.1:9092".to_owned());
    let name = args
        .next()
        .unwrap_or_else(|| "kafka-lock-fenced-example".to_owned());
    let mut options = LockOptions::new(&bootstrap, &name);
    if let Some(topic) = args.next() {
        options = options.ledger_topic(topic);
    }
    let kept = run(options).await?;
    println!("the store holds {kept:?}");
    Ok(())
}

/// Two holders one after the other, the first with a late write; returns what the store holds.
/// (The integration tests run this against their brokers.)
pub async fn run(options: LockOptions) -> Result<String, Box<dyn std::error::Error>> {
    let wait = Some(Duration::from_secs(30));
    let store = FencedStore::default();

    // The first holder writes, then stalls: its hold ends (here by a release, in real life by a
    // lease that ran out while it was paused) but it still has a write in flight.
    let first = options.clone().label("slow holder").acquire(wait).await?;
    let slow_token = first.token();
    store.write(&slow_token, "first holder, early")?;
    println!("first holder wrote with token {slow_token}");
    first.release().await?;

    // The second holder takes over and writes.
    let second = options.label("current holder").acquire(wait).await?;
    let token = second.token();
    store.write(&token, "second holder")?;
    println!("second holder wrote with token {token}");

    // The first holder wakes up and sends its late write: refused.
    match store.write(&slow_token, "first holder, late") {
        Ok(()) => return Err("the store accepted a write from a former holder".into()),
        Err(why) => println!("the late write was refused: {why}"),
    }
    second.release().await?;
    let kept = store.state.lock().unwrap().value.clone();
    Ok(kept)
}
