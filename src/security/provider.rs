//! Which rustls crypto provider runs here: the one a [`TlsProvider`] names, once this build and
//! this CPU (`cpu.rs`) are known to run it. Both the broker connections and the OAuth
//! token endpoint's HTTPS ask it.

use std::sync::{Arc, LazyLock};

use super::{SecurityError, TlsProvider};
use crate::error::{Error, Result};

/// The rustls provider `choice` (the build's default when `None`), once this build and CPU
/// are known to run it; also what the OAuth token endpoint's HTTPS runs on.
pub(crate) fn crypto_provider(
    choice: Option<TlsProvider>,
) -> Result<Arc<rustls::crypto::CryptoProvider>> {
    let Some(choice) = choice.or_else(TlsProvider::build_default) else {
        return Err(config_error("this build has no TLS crypto provider".into()));
    };
    choice.check()?;
    static PROVIDERS: LazyLock<Vec<(TlsProvider, Arc<rustls::crypto::CryptoProvider>)>> =
        LazyLock::new(|| {
            TlsProvider::compiled()
                .iter()
                .map(|&p| (p, Arc::new(build(p))))
                .collect()
        });
    PROVIDERS
        .iter()
        .find(|(p, _)| *p == choice)
        .map(|(_, provider)| Arc::clone(provider))
        .ok_or_else(|| config_error(format!("this build has no TLS provider {choice}")))
}

fn build(provider: TlsProvider) -> rustls::crypto::CryptoProvider {
    match provider {
        #[cfg(feature = "tls")]
        TlsProvider::Ring => rustls::crypto::ring::default_provider(),
        #[cfg(feature = "tls-graviola")]
        TlsProvider::Graviola => rustls_graviola::default_provider(),
        // TlsProvider::compiled() lists only the providers compiled in.
        #[allow(unreachable_patterns)]
        other => unreachable!("{other} is not compiled in"),
    }
}

fn config_error(what: String) -> Error {
    Error::Security(SecurityError::TlsConfig(what))
}
