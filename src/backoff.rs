//! Exponential backoff with jitter, sans-I/O.
//!
//! [`Backoff`] only computes delays; it never sleeps and never reads a clock, so the caller decides
//! how to wait (the driver uses `tokio::time::sleep`, tests just inspect the numbers).
//!
//! Delay `n` (counting from 0 after [`Backoff::reset`]) is
//!
//! ```text
//! base(n)  = min(max, initial * multiplier^n)
//! delay(n) = base(n) * (1 - jitter * r),   r drawn uniformly from [0, 1)
//! ```
//!
//! so with `jitter = 0` the sequence is deterministic, and with `jitter = 1` it is "full jitter"
//! (anything in `(0, base]`). Jitter only ever shortens a delay, so `max` is a hard upper bound, which
//! is what a caller with a deadline needs. Spreading retries matters for kafka-lock in particular:
//! lock waiters are often started by the same scheduler tick, and without jitter they would hammer a
//! recovering broker in lockstep.
//!
//! The random source is injectable ([`Backoff::with_rng`]) so tests are deterministic. The default
//! source is a small SplitMix64 generator seeded from the standard library's per-process random
//! hash keys; it is not cryptographic and does not need to be.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Default first delay.
pub const DEFAULT_INITIAL: Duration = Duration::from_millis(100);
/// Default cap on any single delay.
pub const DEFAULT_MAX: Duration = Duration::from_secs(10);
/// Default growth factor between consecutive delays.
pub const DEFAULT_MULTIPLIER: f64 = 2.0;
/// Default jitter fraction: each delay is drawn from `[base / 2, base]`.
pub const DEFAULT_JITTER: f64 = 0.5;

/// A source of uniformly distributed numbers in `[0, 1)`.
///
/// Values outside that range (or NaN) are clamped, so a faulty source cannot produce a delay
/// longer than the configured maximum.
pub type RandomSource = Box<dyn FnMut() -> f64 + Send>;

/// Exponential backoff with jitter. The module's docs give the formula.
pub struct Backoff {
    initial: Duration,
    max: Duration,
    multiplier: f64,
    jitter: f64,
    /// Base (un-jittered) delay that the next call to [`Backoff::next_delay`] will use.
    base: Duration,
    /// Delays handed out since construction or the last reset.
    attempts: u32,
    rng: RandomSource,
}

impl Backoff {
    /// A backoff with the default random source.
    ///
    /// Out-of-range parameters are clamped rather than rejected, because a backoff is used on error
    /// paths where failing again would hide the original problem: `initial` is lowered to at most
    /// `max`; a `multiplier` below 1 (or not finite) becomes 1; `jitter` is clamped into `[0, 1]`
    /// (NaN becomes 0).
    pub fn new(initial: Duration, max: Duration, multiplier: f64, jitter: f64) -> Self {
        Self::with_rng(initial, max, multiplier, jitter, default_rng())
    }

    /// A backoff drawing its jitter (and [`Backoff::random_index`]) from `rng`, which must return
    /// values in `[0, 1)`.
    pub fn with_rng(
        initial: Duration,
        max: Duration,
        multiplier: f64,
        jitter: f64,
        rng: impl FnMut() -> f64 + Send + 'static,
    ) -> Self {
        let initial = initial.min(max);
        let multiplier = if multiplier >= 1.0 && multiplier.is_finite() {
            multiplier
        } else {
            1.0
        };
        let jitter = if jitter.is_nan() {
            0.0
        } else {
            jitter.clamp(0.0, 1.0)
        };
        Self {
            initial,
            max,
            multiplier,
            jitter,
            base: initial,
            attempts: 0,
            rng: Box::new(rng),
        }
    }

    /// The next delay to wait before retrying. Never longer than the configured maximum.
    pub fn next_delay(&mut self) -> Duration {
        let r = self.sample();
        // `Duration::mul_f64` panics when rounding pushes a result near `Duration::MAX` over it;
        // jitter only shortens, so the base itself is the fallback.
        let delay = Duration::try_from_secs_f64(self.base.as_secs_f64() * (1.0 - self.jitter * r))
            .map_or(self.base, |d| d.min(self.base));
        // Grow in f64 seconds and clamp before converting back, so a long run of failures can
        // neither overflow `Duration` nor exceed `max`.
        let grown = self.base.as_secs_f64() * self.multiplier;
        self.base = if grown >= self.max.as_secs_f64() {
            self.max
        } else {
            Duration::try_from_secs_f64(grown).unwrap_or(self.max)
        };
        self.attempts = self.attempts.saturating_add(1);
        delay
    }

    /// Starts over from the initial delay, e.g. after a success.
    pub fn reset(&mut self) {
        self.base = self.initial;
        self.attempts = 0;
    }

    /// Delays handed out since construction or the last [`Backoff::reset`].
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// A uniformly chosen index in `0..len` from the same random source (0 when `len` is 0).
    ///
    /// Bootstrap uses it to pick where in the broker list to start, so that many clients started
    /// together do not all hit the first broker first.
    pub fn random_index(&mut self, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        let idx = (self.sample() * len as f64) as usize;
        idx.min(len - 1)
    }

    fn sample(&mut self) -> f64 {
        let r = (self.rng)();
        if r.is_nan() {
            0.0
        } else {
            // The largest f64 below 1.0, so `1 - jitter * r` stays positive for jitter = 1.
            r.clamp(0.0, 1.0 - f64::EPSILON / 2.0)
        }
    }
}

impl Default for Backoff {
    /// `DEFAULT_INITIAL`, `DEFAULT_MAX`, `DEFAULT_MULTIPLIER`, `DEFAULT_JITTER`.
    fn default() -> Self {
        Self::new(
            DEFAULT_INITIAL,
            DEFAULT_MAX,
            DEFAULT_MULTIPLIER,
            DEFAULT_JITTER,
        )
    }
}

impl fmt::Debug for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backoff")
            .field("initial", &self.initial)
            .field("max", &self.max)
            .field("multiplier", &self.multiplier)
            .field("jitter", &self.jitter)
            .field("base", &self.base)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014), seeded from `RandomState`, whose keys the standard library
/// draws from the operating system once per process and then varies per instance.
fn default_rng() -> RandomSource {
    let mut state = RandomState::new().build_hasher().finish();
    Box::new(move || unit_interval(splitmix64(&mut state)))
}

/// One SplitMix64 step: advances `state` and returns the next output.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The top 53 bits fill an f64 mantissa exactly, giving a uniform value in [0, 1).
fn unit_interval(x: u64) -> f64 {
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_default_source_is_splitmix64() {
        // The reference outputs for seed 0 of Vigna's splitmix64.c, the published test vector.
        let mut state = 0;
        let got: Vec<u64> = (0..3).map(|_| splitmix64(&mut state)).collect();
        assert_eq!(
            got,
            [
                0xE220_A839_7B1D_CDAF,
                0x6E78_9E6A_A1B9_65F4,
                0x06C4_5D18_8009_454F
            ]
        );
        assert_eq!(unit_interval(0), 0.0);
        assert_eq!(unit_interval(1 << 63), 0.5);
        assert_eq!(unit_interval(u64::MAX), 1.0 - f64::EPSILON / 2.0);
    }

    #[test]
    fn grows_exponentially_up_to_max_without_jitter() {
        let mut b = Backoff::with_rng(ms(100), ms(1000), 2.0, 0.0, || 0.7);
        let got: Vec<_> = (0..6).map(|_| b.next_delay()).collect();
        assert_eq!(
            got,
            [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]
        );
        assert_eq!(b.attempts(), 6);
    }

    #[test]
    fn jitter_shortens_by_the_drawn_fraction() {
        // r = 0.5, jitter = 0.5: every delay is 75 % of its base.
        let mut b = Backoff::with_rng(ms(100), ms(1000), 2.0, 0.5, || 0.5);
        let got: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(got, [ms(75), ms(150), ms(300), ms(600), ms(750)]);
    }

    #[test]
    fn zero_draw_gives_the_full_base() {
        let mut b = Backoff::with_rng(ms(100), ms(1000), 3.0, 1.0, || 0.0);
        let got: Vec<_> = (0..4).map(|_| b.next_delay()).collect();
        assert_eq!(got, [ms(100), ms(300), ms(900), ms(1000)]);
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::with_rng(ms(10), ms(1000), 2.0, 0.0, || 0.0);
        b.next_delay();
        b.next_delay();
        b.reset();
        assert_eq!(b.attempts(), 0);
        assert_eq!(b.next_delay(), ms(10));
        assert_eq!(b.next_delay(), ms(20));
    }

    #[test]
    fn bad_parameters_are_clamped() {
        // initial above max, shrinking multiplier, jitter above 1, NaN and out-of-range draws.
        let mut draws = [f64::NAN, 5.0, -1.0].into_iter().cycle();
        let mut b = Backoff::with_rng(ms(500), ms(200), 0.1, 7.0, move || {
            draws.next().unwrap_or(0.0)
        });
        let first = b.next_delay(); // NaN -> r = 0
        let second = b.next_delay(); // 5.0 -> r just below 1, jitter 1 -> almost 0, but positive
        let third = b.next_delay(); // -1 -> r = 0
        assert_eq!(first, ms(200));
        assert!(second < ms(1), "{second:?}");
        assert_eq!(third, ms(200));

        let mut nan = Backoff::with_rng(ms(1), ms(50), f64::NAN, f64::NAN, || 0.9);
        assert_eq!(nan.next_delay(), ms(1));
        assert_eq!(nan.next_delay(), ms(1));
    }

    #[test]
    fn never_exceeds_max_or_overflows_after_many_attempts() {
        let mut b = Backoff::with_rng(ms(1), Duration::from_secs(30), 1e6, 0.0, || 0.0);
        for _ in 0..10_000 {
            assert!(b.next_delay() <= Duration::from_secs(30));
        }
        let mut huge =
            Backoff::with_rng(Duration::from_secs(1), Duration::MAX, f64::MAX, 0.0, || 0.0);
        for _ in 0..100 {
            assert!(huge.next_delay() <= Duration::MAX);
        }
    }

    #[test]
    fn duration_max_settings_never_panic() {
        let draws = [0.0, 0.5, 0.999_999, f64::NAN];
        for (multiplier, jitter) in [(2.0, 0.0), (2.0, 0.5), (f64::MAX, 1.0), (1.0, 0.3)] {
            for draw in draws {
                let mut b = Backoff::with_rng(
                    Duration::MAX,
                    Duration::MAX,
                    multiplier,
                    jitter,
                    move || draw,
                );
                for _ in 0..3 {
                    let d = b.next_delay();
                    // Jitter of at most one half keeps at least half of the base.
                    if jitter <= 0.5 {
                        assert!(d >= Duration::MAX / 2, "{d:?}");
                    }
                }
                b.reset();
                assert_eq!(b.attempts(), 0);
            }
        }
        // A small start growing into an unbounded cap passes through every magnitude.
        let mut b = Backoff::with_rng(Duration::from_nanos(1), Duration::MAX, 1e3, 0.5, || 0.5);
        let mut previous = Duration::ZERO;
        for _ in 0..20 {
            let d = b.next_delay();
            assert!(d >= previous, "{d:?} after {previous:?}");
            previous = d;
        }
        assert!(previous > Duration::from_secs(1 << 40), "{previous:?}");
    }

    #[test]
    fn random_index_is_in_range() {
        let mut draws = [0.0, 0.5, 0.999_999, 1.0].into_iter().cycle();
        let mut b = Backoff::with_rng(ms(1), ms(2), 2.0, 0.0, move || draws.next().unwrap_or(0.0));
        assert_eq!(b.random_index(4), 0);
        assert_eq!(b.random_index(4), 2);
        assert_eq!(b.random_index(4), 3);
        assert_eq!(b.random_index(4), 3);
        assert_eq!(b.random_index(0), 0);
    }

    #[test]
    fn default_rng_is_in_unit_interval_and_varies() {
        let mut rng = default_rng();
        let draws: Vec<f64> = (0..1000).map(|_| rng()).collect();
        assert!(draws.iter().all(|r| (0.0..1.0).contains(r)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        // Generous bound: the mean of 1000 uniform draws is 0.5 with sd ~0.009.
        assert!((0.4..0.6).contains(&mean), "mean {mean}");
        let mut b = Backoff::default();
        let d = b.next_delay();
        assert!(d >= DEFAULT_INITIAL / 2 && d <= DEFAULT_INITIAL, "{d:?}");
    }
}
