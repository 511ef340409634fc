//! How many heap bytes a held lock keeps: N distinct locks taken through one [`Client`] under a
//! counting global allocator, which reports the bytes live before, at the peak, and while the
//! locks are held (BENCHMARKS.md, "Memory per held lock").
//!
//! ```text
//! cargo run --release --no-default-features --example many_locks_heap -- BOOTSTRAP N HOLD_SECS [LOCK_PREFIX]
//! ```
//!
//! The locks are taken all at once with a 3 s heartbeat, as in `examples/many_locks.rs`; the
//! count while holding is read after HOLD_SECS, once the connections opened for the joins have
//! been closed for idleness (60 s). It prints one line of `key=value` pairs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use kafka_lock::Client;

/// The system allocator, counting the bytes and blocks live and the most bytes ever live.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static BLOCKS: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Blocks live by exact size (the last slot counts every larger block), to tell the owners
/// apart: most per-lock structures have a size of their own.
const SIZES: usize = 16 * 1024;
static BY_SIZE: [AtomicIsize; SIZES + 1] = [const { AtomicIsize::new(0) }; SIZES + 1];

fn count(size: usize, by: isize) {
    BY_SIZE[size.min(SIZES)].fetch_add(by, Relaxed);
}

fn grew(by: usize) {
    let now = LIVE.fetch_add(by as isize, Relaxed) + by as isize;
    PEAK.fetch_max(now.max(0) as usize, Relaxed);
}

// SAFETY: every call is passed on to `System` unchanged; the counters only observe. A global
// allocator can only be written with `unsafe`; this example is measurement, not library code.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
            BLOCKS.fetch_add(1, Relaxed);
            count(layout.size(), 1);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
            BLOCKS.fetch_add(1, Relaxed);
            count(layout.size(), 1);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Relaxed);
        BLOCKS.fetch_sub(1, Relaxed);
        count(layout.size(), -1);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size() as isize, Relaxed);
            grew(new_size);
            count(layout.size(), -1);
            count(new_size, 1);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const ACQUIRE_WAIT: Duration = Duration::from_secs(600);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "usage: many_locks_heap BOOTSTRAP N HOLD_SECS [LOCK_PREFIX]";
    let mut args = std::env::args().skip(1);
    let bootstrap = args.next().ok_or(usage)?;
    let n: usize = args.next().ok_or(usage)?.parse().map_err(|_| usage)?;
    let hold: u64 = args.next().ok_or(usage)?.parse().map_err(|_| usage)?;
    let prefix = args.next().unwrap_or_else(|| "many-locks-heap".to_owned());

    let mut client = Client::new(&bootstrap);
    // `Client::acquisitions_at_once`, as in `examples/many_locks.rs`.
    if let Some(k) = std::env::var("MANY_LOCKS_AT_ONCE")
        .ok()
        .and_then(|k| k.parse().ok())
    {
        client = client.acquisitions_at_once(k);
    }
    // What each waiting acquisition keeps while it waits (its future, not yet polled).
    let acquire_future = std::mem::size_of_val(&client.lock("-").acquire(None));
    // The guards' vector is sized first, so that its growth is not counted as the locks'.
    let mut guards = Vec::with_capacity(n);
    let (live0, blocks0) = (LIVE.load(Relaxed), BLOCKS.load(Relaxed));
    let sizes0: Vec<isize> = BY_SIZE.iter().map(|c| c.load(Relaxed)).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let lock = client
            .lock(format!("{prefix}-{i}"))
            .heartbeat_interval(Duration::from_secs(3));
        tasks.spawn(async move {
            match tokio::time::timeout(ACQUIRE_WAIT, lock.acquire(None)).await {
                Ok(Ok(guard)) => Some(guard),
                Ok(Err(e)) => {
                    eprintln!("{}: {e}", lock.name());
                    None
                }
                Err(_) => None,
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        if let Some(guard) = joined? {
            guards.push(guard);
        }
    }
    drop(tasks);
    let acquired = guards.len();
    let live_acquired = LIVE.load(Relaxed) - live0;
    tokio::time::sleep(Duration::from_secs(hold)).await;
    let held = guards.iter().filter(|g| g.is_held()).count();
    let live_held = LIVE.load(Relaxed) - live0;
    let blocks_held = BLOCKS.load(Relaxed) - blocks0;
    let per = |b: isize| b / acquired.max(1) as isize;
    println!(
        "n={n} acquired={acquired} held={held} live_after_acquire={live_acquired} \
         peak={} live_held={live_held} blocks_held={blocks_held} \
         bytes_per_lock={} blocks_per_lock={} acquire_future={acquire_future}",
        PEAK.load(Relaxed) as isize - live0,
        per(live_held),
        blocks_held as f64 / acquired.max(1) as f64,
    );
    // Where the bytes are, by block size: the sizes holding the most bytes per lock.
    let mut sizes: Vec<(usize, isize)> = BY_SIZE
        .iter()
        .zip(&sizes0)
        .enumerate()
        .map(|(size, (c, c0))| (size, c.load(Relaxed) - c0))
        .filter(|&(_, blocks)| blocks > 0)
        .collect();
    sizes.sort_by_key(|&(size, blocks)| std::cmp::Reverse(size as isize * blocks));
    for (size, blocks) in sizes.into_iter().take(25) {
        let label = if size == SIZES {
            format!(">={SIZES}")
        } else {
            size.to_string()
        };
        eprintln!(
            "size {label:>6} B: {:>8.2} blocks/lock, {:>7} B/lock",
            blocks as f64 / acquired.max(1) as f64,
            size as isize * blocks / acquired.max(1) as isize
        );
    }
    for guard in guards {
        let _ = guard.release().await;
    }
    Ok(())
}
