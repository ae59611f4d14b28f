//! What one client can cost the server: body size, time to send a body, request bytes held at once,
//! requests in flight on one connection, connections, and worker threads. A webhook under
//! `failurePolicy: Fail` that falls over blocks pod creation cluster-wide, so every limit answers fast
//! (413, 408, 503) instead of letting memory or waiting grow.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The API server may send a 3 MiB object twice (an UPDATE): 8 MiB leaves room for the envelope.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Request bytes held in memory at once, over all connections (eight of the largest bodies).
pub const DEFAULT_MAX_INFLIGHT_BYTES: usize = 64 * 1024 * 1024;
/// Time to receive a whole body (shortened further by the API server's `?timeout=`).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Requests in flight on one connection (HTTP/2 streams; HTTP/1.1 has one at a time).
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: usize = 100;
/// Open connections over all workers (the API server keeps a handful per replica).
pub const DEFAULT_MAX_CONNECTIONS: usize = 2048;
/// Open connections from one client address: an API server over HTTP/1.1 opens one per call in
/// flight, far fewer than this; one pod cannot hold more than an eighth of the total.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_inflight_bytes: usize,
    pub read_timeout: Duration,
    pub max_streams_per_connection: usize,
    pub max_connections: usize,
    pub max_connections_per_address: usize,
    /// Worker threads of the HTTP server.
    pub workers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
            read_timeout: DEFAULT_READ_TIMEOUT,
            max_streams_per_connection: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            workers: default_workers(),
        }
    }
}

/// At least two workers: with a `cpu: 1` limit the runtime would see one core and run one worker,
/// so one slow request would stall `/healthz` and every other request of the replica.
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(2, usize::from)
        .max(2)
}

/// The request bytes the server holds, as permits of one semaphore shared by every worker.
#[derive(Debug, Clone)]
pub struct BodyBudget(Arc<Semaphore>);

impl BodyBudget {
    pub fn new(bytes: usize) -> Self {
        Self(Arc::new(Semaphore::new(bytes.min(Semaphore::MAX_PERMITS))))
    }

    /// Takes `bytes` from the budget until the returned permit is dropped; `None` when the budget is
    /// spent (the caller answers 503 at once rather than wait or grow).
    pub fn take(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let bytes = u32::try_from(bytes).ok()?;
        self.0.clone().try_acquire_many_owned(bytes).ok()
    }

    /// Bytes not held by any request now.
    pub fn available(&self) -> usize {
        self.0.available_permits()
    }
}

/// Requests in flight on one connection: a semaphore put into each connection's data.
#[derive(Debug, Clone)]
pub struct ConnectionStreams(pub Arc<Semaphore>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_returned_when_a_request_ends() {
        let budget = BodyBudget::new(100);
        let a = budget.take(60).unwrap();
        assert!(budget.take(60).is_none(), "only 40 left");
        let b = budget.take(40).unwrap();
        assert_eq!(budget.available(), 0);
        drop((a, b));
        assert_eq!(budget.available(), 100);
        assert!(default_workers() >= 2);
    }
}
