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
//! been closed for idleness (60 s). It prints one line of `key=value` pairs on stdout. On stderr:
//! the heap live right after the last acquisition, with the process's RSS (Linux) and the block
//! sizes holding the most; then, every `MANY_LOCKS_HEAP_EVERY` seconds of the hold (default: at
//! its end), the heap live and RSS again with the sizes freed since the look before, which
//! names what the acquisitions left behind and when it went; last, the sizes live while
//! holding.

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
    // So are the by-size snapshots (128 KB each).
    let (mut sizes0, mut last, mut sizes) =
        (vec![0; SIZES + 1], vec![0; SIZES + 1], vec![0; SIZES + 1]);
    snapshot(&mut sizes0);
    eprintln!("before the locks{}", rss());
    let (live0, blocks0) = (LIVE.load(Relaxed), BLOCKS.load(Relaxed));
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
    let per_lock = |bytes: isize| bytes / acquired.max(1) as isize;
    snapshot(&mut last);
    eprintln!(
        "right after acquiring: {} B/lock live, heap peak {} B/lock{}",
        per_lock(live_acquired),
        per_lock(PEAK.load(Relaxed) as isize - live0),
        rss()
    );
    print_sizes(&last, &sizes0, acquired, "live");
    // What leaves the heap while the locks are held, and when (MANY_LOCKS_HEAP_EVERY seconds
    // apart): the sizes whose blocks were freed since the last look name what the acquisition
    // left behind.
    let every = std::env::var("MANY_LOCKS_HEAP_EVERY")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .unwrap_or(hold.max(1));
    let (started, end) = (
        tokio::time::Instant::now(),
        tokio::time::Instant::now() + Duration::from_secs(hold),
    );
    while tokio::time::Instant::now() < end {
        let next = (tokio::time::Instant::now() + Duration::from_secs(every)).min(end);
        tokio::time::sleep_until(next).await;
        snapshot(&mut sizes);
        eprintln!(
            "after {:.0} s of holding: {} B/lock live{}",
            started.elapsed().as_secs_f64(),
            per_lock(LIVE.load(Relaxed) - live0),
            rss()
        );
        print_sizes(&last, &sizes, acquired, "freed since the last look");
        std::mem::swap(&mut last, &mut sizes);
    }
    let held = guards.iter().filter(|g| g.is_held()).count();
    let live_held = LIVE.load(Relaxed) - live0;
    let blocks_held = BLOCKS.load(Relaxed) - blocks0;
    println!(
        "n={n} acquired={acquired} held={held} live_after_acquire={live_acquired} \
         peak={} live_held={live_held} blocks_held={blocks_held} \
         bytes_per_lock={} blocks_per_lock={} acquire_future={acquire_future}",
        PEAK.load(Relaxed) as isize - live0,
        per_lock(live_held),
        blocks_held as f64 / acquired.max(1) as f64,
    );
    eprintln!("while holding:");
    print_sizes(&last, &sizes0, acquired, "live");
    for guard in guards {
        let _ = guard.release().await;
    }
    Ok(())
}

/// The process's resident set now and at its peak (Linux), to set beside the heap: what the
/// allocator keeps of what was freed is resident but no longer live.
fn rss() -> String {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return String::new();
    };
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().trim_end_matches(" kB").to_owned())
            .unwrap_or_default()
    };
    format!(", RSS {} kB (peak {} kB)", kb("VmRSS:"), kb("VmHWM:"))
}

/// Blocks live now, by size, into `into` (allocating nothing, so the count stays the locks').
fn snapshot(into: &mut [isize]) {
    for (to, c) in into.iter_mut().zip(&BY_SIZE) {
        *to = c.load(Relaxed);
    }
}

/// The 25 block sizes with the most bytes per lock in `a` minus `b`, on stderr.
fn print_sizes(a: &[isize], b: &[isize], locks: usize, what: &str) {
    let locks = locks.max(1);
    let mut sizes: Vec<(usize, isize)> = a
        .iter()
        .zip(b)
        .enumerate()
        .map(|(size, (a, b))| (size, a - b))
        .filter(|&(_, blocks)| blocks > 0)
        .collect();
    sizes.sort_by_key(|&(size, blocks)| std::cmp::Reverse(size.max(1) as isize * blocks));
    for (size, blocks) in sizes.into_iter().take(25) {
        let label = if size == SIZES {
            format!(">={SIZES}")
        } else {
            size.to_string()
        };
        eprintln!(
            "  size {label:>6} B: {:>8.2} blocks/lock, {:>7} B/lock {what}",
            blocks as f64 / locks as f64,
            size as isize * blocks / locks as isize
        );
    }
}
