//! Whether this CPU can run the graviola crypto provider (feature `tls-graviola`).
//!
//! graviola's routines are written for CPU extensions it does not check before each use: on a
//! CPU without them it stops the process with an assertion (graviola 0.4, `low/*/cpu.rs`,
//! `verify_cpu_features`), which the CLI's `panic = "abort"` turns into a crash. So the check
//! happens here, before any TLS: [`Security::validate`](crate::security::Security::validate) and
//! every TLS connection ask [`check`], which names what is missing in a typed error.

use std::sync::OnceLock;

use crate::security::{SecurityError, TlsProvider};

/// What graviola needs (its README's "Limitations", and the run-time check of graviola 0.4.4:
/// aes, pclmulqdq, bmi1, adx, avx and avx2 on x86_64; neon, aes, pmull and sha2 on aarch64), in
/// the names of `is_x86_feature_detected!` / `is_aarch64_feature_detected!`.
const X86_64: &[&str] = &[
    "aes",
    "pclmulqdq",
    "ssse3",
    "avx",
    "avx2",
    "bmi1",
    "bmi2",
    "adx",
];
const AARCH64: &[&str] = &["neon", "aes", "pmull", "sha2"];

/// The CPU architectures graviola has routines for.
// Each build probes its own; the tests use both.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    fn needs(self) -> &'static [&'static str] {
        match self {
            Arch::X86_64 => X86_64,
            Arch::Aarch64 => AARCH64,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }
}

/// The features of `arch` that graviola needs and `has` says are absent.
pub(crate) fn missing(arch: Arch, has: impl Fn(&str) -> bool) -> Vec<&'static str> {
    arch.needs().iter().copied().filter(|f| !has(f)).collect()
}

/// The result of [`missing`] as the error a caller reports.
pub(crate) fn verdict(arch: Arch, has: impl Fn(&str) -> bool) -> Result<(), SecurityError> {
    let missing = missing(arch, has);
    if missing.is_empty() {
        return Ok(());
    }
    Err(SecurityError::UnsupportedCpu {
        provider: TlsProvider::Graviola,
        arch: arch.name().to_owned(),
        missing: missing.into_iter().map(str::to_owned).collect(),
    })
}

/// This machine's architecture and its CPU's answer, asked once per process.
pub(crate) fn check() -> Result<(), SecurityError> {
    static VERDICT: OnceLock<Result<(), SecurityError>> = OnceLock::new();
    VERDICT.get_or_init(probe_this_cpu).clone()
}

#[cfg(target_arch = "x86_64")]
fn probe_this_cpu() -> Result<(), SecurityError> {
    verdict(Arch::X86_64, |f| match f {
        "aes" => std::arch::is_x86_feature_detected!("aes"),
        "pclmulqdq" => std::arch::is_x86_feature_detected!("pclmulqdq"),
        "ssse3" => std::arch::is_x86_feature_detected!("ssse3"),
        "avx" => std::arch::is_x86_feature_detected!("avx"),
        "avx2" => std::arch::is_x86_feature_detected!("avx2"),
        "bmi1" => std::arch::is_x86_feature_detected!("bmi1"),
        "bmi2" => std::arch::is_x86_feature_detected!("bmi2"),
        "adx" => std::arch::is_x86_feature_detected!("adx"),
        _ => false,
    })
}

#[cfg(target_arch = "aarch64")]
fn probe_this_cpu() -> Result<(), SecurityError> {
    verdict(Arch::Aarch64, |f| match f {
        "neon" => std::arch::is_aarch64_feature_detected!("neon"),
        "aes" => std::arch::is_aarch64_feature_detected!("aes"),
        "pmull" => std::arch::is_aarch64_feature_detected!("pmull"),
        "sha2" => std::arch::is_aarch64_feature_detected!("sha2"),
        _ => false,
    })
}

// graviola itself does not build for other architectures; this keeps the message ours if it
// ever does.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn probe_this_cpu() -> Result<(), SecurityError> {
    Err(SecurityError::UnsupportedCpu {
        provider: TlsProvider::Graviola,
        arch: std::env::consts::ARCH.to_owned(),
        missing: vec!["an x86_64 or aarch64 CPU".to_owned()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_with_everything_passes() {
        assert_eq!(verdict(Arch::X86_64, |_| true), Ok(()));
        assert_eq!(verdict(Arch::Aarch64, |_| true), Ok(()));
    }

    #[test]
    fn each_missing_feature_is_named_in_one_line() {
        for arch in [Arch::X86_64, Arch::Aarch64] {
            for &lacking in arch.needs() {
                let err = verdict(arch, |f| f != lacking).unwrap_err();
                let SecurityError::UnsupportedCpu { missing, .. } = &err else {
                    panic!("{err:?}")
                };
                assert_eq!(missing, &[lacking.to_owned()]);
                let text = err.to_string();
                assert!(text.contains(lacking), "{text}");
                assert!(text.contains(arch.name()), "{text}");
                assert!(!text.contains('\n'), "{text}");
            }
        }
    }

    #[test]
    fn an_old_x86_64_lacks_several() {
        // A Sandy Bridge (2011): AES-NI, PCLMULQDQ, SSSE3 and AVX, but no AVX2, BMI or ADX.
        let sandy_bridge = ["aes", "pclmulqdq", "ssse3", "avx"];
        assert_eq!(
            missing(Arch::X86_64, |f| sandy_bridge.contains(&f)),
            ["avx2", "bmi1", "bmi2", "adx"]
        );
    }

    #[test]
    fn this_machine_gives_an_answer_and_keeps_it() {
        assert_eq!(check(), check());
    }
}
