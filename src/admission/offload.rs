//! CPU-heavy rules run on tokio's blocking pool rather than on the async workers, so one expensive
//! request never stalls the worker that also answers other reviews and `/healthz`.
//!
//! At most one heavy check per core runs at once (the rest wait for a slot); the chain's deadline
//! (`?timeout=` less a margin) still bounds how long a request waits for its answer. A check whose
//! request has given up runs to its end (a blocking thread cannot be interrupted) but keeps its slot
//! until then, so abandoned work never piles up beyond the slots.

use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;

use crate::memory::Meter;
use crate::memory::counting::charge;

/// Slots for heavy checks, shared by every worker of the process.
fn slots() -> &'static Arc<Semaphore> {
    static SLOTS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SLOTS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Arc::new(Semaphore::new(cores))
    })
}

/// Runs `work` on the blocking pool once a slot is free. A panic in `work` resumes here, so the
/// chain turns it into a 500 for this request alone, as it does for any plugin.
pub async fn heavy<R, F>(work: F) -> R
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    let slot = slots()
        .clone()
        .acquire_owned()
        .await
        .expect("the heavy-check semaphore is never closed");
    let task = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        // Counts what the check takes, to charge it to the request below; the check's own reads
        // hold their limits (the ConfigMap's JSON is read under its text's allowance,
        // `slo_config/go_json.rs`), and its data is at most the API server's 1 MiB.
        let meter = Meter::start(usize::MAX);
        let result = work();
        (result, meter.peak())
    });
    match task.await {
        Ok((result, peak)) => {
            // What the check took counts for the request that asked for it.
            charge(peak);
            result
        }
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Only a runtime shutting down cancels a blocking task.
        Err(e) => panic!("heavy check cancelled: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "current_thread")]
    async fn a_heavy_check_leaves_the_worker_free() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let check = tokio::spawn(heavy(move || {
            // Blocks its thread until told to stop: a current-thread runtime would hang here.
            rx.recv_timeout(Duration::from_secs(10)).is_ok()
        }));
        // The worker still runs other tasks while the check blocks.
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.send(()).unwrap();
        assert!(
            check.await.unwrap(),
            "the check finished after it was released"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_panic_in_a_heavy_check_reaches_the_caller() {
        let outcome = tokio::spawn(heavy(|| -> u8 { panic!("boom") })).await;
        let panic = outcome.unwrap_err().into_panic();
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"boom"));
    }
}
