//! Replays every committed fuzz input on stable Rust, without libFuzzer.
//!
//! `fuzz/corpus/<target>/` holds the minimised corpora and `fuzz/regressions/<target>/` every input
//! that ever crashed, ran out of memory or timed out (plus hand-written inputs for hazards known
//! in advance). Each file goes through the same function the fuzz target calls, from
//! `fuzz/targets.rs`, so a fixed bug stays fixed in plain `cargo test`. See `docs/fuzzing.md`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod targets {
    // The shared file names the library `kafka_lock`, as the fuzz crate sees it.
    use crate as kafka_lock;
    include!("../fuzz/targets.rs");
}

/// Generous: every input is a few KiB at most and finishes in milliseconds, even unoptimised.
const PER_INPUT: Duration = Duration::from_secs(2);

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of `fuzz/<root>/<target>/`, failing if the directory is missing or empty.
fn inputs(root: &str, target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join(root).join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}; every fuzz target needs it", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    files
}

/// Every subdirectory of `fuzz/<root>/` must belong to a target, so no input is silently skipped.
fn assert_no_unknown_targets(root: &str) {
    let dir = fuzz_dir().join(root);
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("readable directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        assert!(
            targets::TARGETS.iter().any(|(t, _)| *t == name),
            "{}: no fuzz target of that name",
            path.display()
        );
    }
}

fn replay(root: &str) -> usize {
    assert_no_unknown_targets(root);
    let mut count = 0;
    for &(target, run) in targets::TARGETS {
        for path in inputs(root, target) {
            let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let started = Instant::now();
            if let Err(panic) = std::panic::catch_unwind(|| run(&data)) {
                let msg = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                panic!("{target}: {} failed: {msg}", path.display());
            }
            let took = started.elapsed();
            assert!(
                took < PER_INPUT,
                "{target}: {} took {took:?}",
                path.display()
            );
            count += 1;
        }
    }
    count
}

#[test]
fn corpus_replays() {
    let n = replay("corpus");
    assert!(n >= targets::TARGETS.len());
}

#[test]
fn regressions_replay() {
    let n = replay("regressions");
    assert!(n >= targets::TARGETS.len());
}

/// The response corpus keeps one input per supported (API, version), so `cargo test` decodes
/// every version even where minimisation would have merged versions that share a code path.
#[test]
fn response_corpus_covers_every_supported_version() {
    let mut seen = std::collections::HashSet::new();
    for path in inputs("corpus", "response_decode") {
        let data = std::fs::read(&path).expect("readable corpus file");
        if let [key, version, ..] = data[..] {
            seen.insert((i16::from(key), i16::from(version as i8)));
        }
    }
    let missing: Vec<String> = crate::wire::versions::SUPPORTED
        .iter()
        .flat_map(|&(api, min, max)| (min..=max).map(move |v| (api, v)))
        .filter(|&(api, v)| !seen.contains(&(api as i16, v)))
        .map(|(api, v)| format!("{api:?} v{v}"))
        .collect();
    assert!(missing.is_empty(), "no corpus input for {missing:?}");
}

/// Writes one seed per supported (API, version), a valid body from the guard's generator, next to
/// the seeds made from the captured frames of `testdata/`. Run by hand when `SUPPORTED`
/// grows: `cargo test --lib fuzz_replay::write_generated_seeds -- --ignored`.
#[test]
#[ignore = "writes files; run by hand to refresh seeds"]
fn write_generated_seeds() {
    let dir = fuzz_dir().join("corpus/response_decode");
    std::fs::create_dir_all(&dir).expect("corpus directory");
    for &(api, min, max) in crate::wire::versions::SUPPORTED {
        for version in min..=max {
            let body = crate::wire::guard::tests::generate(api, version, 7);
            let mut input = vec![api as i16 as u8, version as u8];
            input.extend_from_slice(&body);
            let name = format!("generated-{:?}-v{version}", api).to_lowercase();
            std::fs::write(dir.join(name), input).expect("seed written");
        }
    }
}
