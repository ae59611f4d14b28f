//! A serving pair read from files and re-read when they change, so a pair renewed on disk (a
//! mounted Secret kept by cert-manager, say) is served without a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::error::TlsError;
use super::resolver::CertResolver;

/// The two files of a serving pair, with the contents last put in service.
#[derive(Clone, Debug)]
pub struct PairFiles {
    cert: PathBuf,
    key: PathBuf,
    served: Option<(Vec<u8>, Vec<u8>)>,
}

impl PairFiles {
    pub fn new(cert: PathBuf, key: PathBuf) -> Self {
        Self {
            cert,
            key,
            served: None,
        }
    }

    fn read(&self) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    /// Loads the pair into `resolver`, failing when either file is unreadable or unusable.
    pub fn load(&mut self, resolver: &CertResolver) -> Result<(), TlsError> {
        let (cert, key) = self.read()?;
        resolver.set_pem(&cert, &key)?;
        self.served = Some((cert, key));
        Ok(())
    }

    /// Re-reads the files every `interval` and swaps the served pair when their contents change.
    /// A pair caught half-written, or otherwise unusable, is logged and the pair in service stays;
    /// it is tried again on the next round. `on_reload` runs after each successful swap.
    pub async fn watch(
        mut self,
        resolver: Arc<CertResolver>,
        interval: Duration,
        on_reload: impl Fn() + Send,
    ) {
        let mut last = self.served.take();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let current = match self.read() {
                Ok(current) => current,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot re-read the serving pair; keeping the one in service");
                    continue;
                }
            };
            if last.as_ref() == Some(&current) {
                continue;
            }
            match resolver.set_pem(&current.0, &current.1) {
                Ok(()) => {
                    tracing::info!(cert = %self.cert.display(), "serving certificate reloaded from files");
                    on_reload();
                    last = Some(current);
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    cert = %self.cert.display(),
                    "the serving pair on disk is unusable; keeping the one in service"
                ),
            }
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Io {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs;

    fn write_pair(dir: &Path, name: &str) -> Vec<u8> {
        let pair =
            certs::self_signed(name, &["localhost".to_owned()], Duration::from_secs(3600)).unwrap();
        std::fs::write(dir.join("tls.crt"), &pair.cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), &pair.key_pem).unwrap();
        pair.cert_pem.into_bytes()
    }

    async fn served_becomes(resolver: &CertResolver, pem: &[u8]) -> bool {
        for _ in 0..200 {
            if resolver.current().is_some_and(|p| p.cert_pem == pem) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn a_changed_pair_is_served_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = PairFiles::new(dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let first = write_pair(dir.path(), "first");
        let resolver = Arc::new(CertResolver::new());
        files.load(&resolver).unwrap();
        let reloads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = reloads.clone();
        let task = tokio::spawn(files.clone().watch(
            resolver.clone(),
            Duration::from_millis(20),
            move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            },
        ));
        assert_eq!(resolver.current().unwrap().cert_pem, first);

        let second = write_pair(dir.path(), "second");
        assert!(
            served_becomes(&resolver, &second).await,
            "the new pair is served"
        );

        // A key that does not parse: the pair in service stays.
        std::fs::write(dir.path().join("tls.key"), b"not a key").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(resolver.current().unwrap().cert_pem, second);
        // A certificate with another pair's key (a renewal caught between the two writes).
        let other = certs::self_signed("other", &["localhost".to_owned()], Duration::from_secs(60))
            .unwrap();
        std::fs::write(dir.path().join("tls.key"), &other.key_pem).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(resolver.current().unwrap().cert_pem, second);
        // Files removed: still serving.
        std::fs::remove_file(dir.path().join("tls.crt")).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(resolver.current().unwrap().cert_pem, second);

        let third = write_pair(dir.path(), "third");
        assert!(
            served_becomes(&resolver, &third).await,
            "recovers once the files are whole"
        );
        assert_eq!(reloads.load(std::sync::atomic::Ordering::Relaxed), 2);
        task.abort();
    }

    #[test]
    fn a_missing_file_is_named_in_the_error() {
        let mut files = PairFiles::new(
            PathBuf::from("/nonexistent/tls.crt"),
            PathBuf::from("/nonexistent/tls.key"),
        );
        let err = files.load(&CertResolver::new()).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/tls.crt"), "{err}");
    }
}
