//! What one client can cost the server: body size, time to send a body, request bytes held at once,
//! requests in flight on one connection, connections, and worker threads. A webhook under
//! `failurePolicy: Fail` that falls over blocks pod creation cluster-wide, so every limit answers fast
//! (413, 408, 503) instead of letting memory or waiting grow.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::duration::parse_duration_arg;

/// The API server may send a 3 MiB object twice (an UPDATE): 8 MiB leaves room for the envelope.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Request bytes held in memory at once, over all connections (eight of the largest bodies).
pub const DEFAULT_MAX_INFLIGHT_BYTES: usize = 64 * 1024 * 1024;
/// Memory a review may take while decoded and run, estimated from its body before decoding
/// ([`decoded_estimate`](crate::memory::decoded_estimate)), over all requests at once, when the container's memory limit is not known.
pub const DEFAULT_DECODE_BUDGET: usize = 96 * 1024 * 1024;
/// The share of the container's memory limit (`KOORD_WEBHOOK_MEMORY_LIMIT`, from the Downward API)
/// given to decoding, in eighths: with the raw request bytes (a quarter at most) and the cache and
/// runtime, the worst mix stays under the limit.
pub const DECODE_BUDGET_EIGHTHS: u64 = 3;
/// Time to receive a whole body (shortened further by the API server's `?timeout=`).
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest pause between two pieces of one body. The API server writes a body it holds in memory
/// at once; a caller that sends most of a body and then waits holds its bytes for nothing.
pub const DEFAULT_BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(2);
/// The share of the in-flight bytes one client address may hold, in quarters (at least one body of
/// the largest size): the callers of one address cannot refuse everyone else.
pub const ADDRESS_SHARE_QUARTERS: usize = 1;
/// Requests in flight on one connection (HTTP/2 streams; HTTP/1.1 has one at a time).
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: usize = 100;
/// Open connections over all workers (the API server keeps a handful per replica).
pub const DEFAULT_MAX_CONNECTIONS: usize = 2048;
/// Open connections from one client address: an API server over HTTP/1.1 opens one per call in
/// flight, far fewer than this; one pod cannot hold more than an eighth of the total.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 256;
/// The most one open connection can make the server hold outside every byte budget: a request head
/// actix-http buffers whole before parsing it (up to 128 KiB, then 431), its read buffer's spare
/// room, and the TLS session's buffers. Measured: 2,048 connections each left with a 127 KiB half
/// head took 110-150 KiB apiece (`bench/hostile.py`, half-heads; `tests/it/server_limits.rs`).
pub const CONNECTION_WORST_BYTES: u64 = 160 * 1024;
/// The share of the container's memory limit that open connections may hold at their worst, in
/// quarters: with `--memory-limit` the connection cap is what this share holds at
/// [`CONNECTION_WORST_BYTES`] each (the chart's 384 MiB: 614; one address at most 256 of them).
pub const CONNECTION_SHARE_QUARTERS: u64 = 1;

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_inflight_bytes: usize,
    pub read_timeout: Duration,
    pub body_idle_timeout: Duration,
    pub max_streams_per_connection: usize,
    pub max_connections: usize,
    pub max_connections_per_address: usize,
    /// Estimated decoded memory of the reviews in flight ([`decoded_estimate`](crate::memory::decoded_estimate)).
    pub decode_budget: usize,
    /// Worker threads of the HTTP server.
    pub workers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
            read_timeout: DEFAULT_READ_TIMEOUT,
            body_idle_timeout: DEFAULT_BODY_IDLE_TIMEOUT,
            max_streams_per_connection: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            decode_budget: DEFAULT_DECODE_BUDGET,
            workers: default_workers(),
        }
    }
}

impl Limits {
    /// The request bytes one client address may hold at once: a quarter of the in-flight bytes, and
    /// never less than one body of the largest size (or all of them, if that is less).
    pub fn address_share(&self) -> usize {
        (self.max_inflight_bytes / 4 * ADDRESS_SHARE_QUARTERS)
            .max(self.max_body_bytes.min(self.max_inflight_bytes))
    }
}

/// At least two workers: with a `cpu: 1` limit the runtime would see one core and run one worker,
/// so one slow request would stall `/healthz` and every other request of the replica.
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(2, usize::from)
        .max(2)
}

/// Request bytes held per client address.
type ByAddress = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// The request bytes the server holds, as permits of one semaphore shared by every worker, and what
/// each client address holds of them.
///
/// An address holds at most its share; and the last [`RESERVE_QUARTERS`] of the bytes are kept for
/// addresses that hold little ([`reserve_share`](BodyBudget::reserve_share) each), so several
/// addresses at their share together still leave every other caller room for its reviews.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    permits: Arc<Semaphore>,
    by_address: ByAddress,
    share: usize,
    total: usize,
}

/// The part of the request bytes, in quarters, that an address holding more than
/// [`BodyBudget::reserve_share`] cannot take while other addresses hold bytes.
pub const RESERVE_QUARTERS: usize = 1;
/// What one address may hold of the reserve: a sixteenth of it (a review of ordinary size is a few
/// KiB; 64 MiB of budget keep 1 MiB per address).
pub const RESERVE_SHARES: usize = 16;

/// Request bytes held until dropped: in the server's budget, and in its address's share.
#[derive(Debug)]
pub struct BodyHold {
    _permit: OwnedSemaphorePermit,
    address: Option<(ByAddress, IpAddr)>,
    bytes: usize,
}

/// Why bytes could not be taken.
#[derive(Debug, PartialEq, Eq)]
pub enum BudgetFull {
    /// The server holds its maximum.
    Server,
    /// This client address holds its share.
    Address { share: usize },
    /// What is left is the reserve, and this address holds more than its part of it.
    Reserve { per_address: usize },
}

impl BodyBudget {
    /// `bytes` in all, `share` of them for one address.
    pub fn new(bytes: usize, share: usize) -> Self {
        let total = bytes.min(Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(total)),
            by_address: Arc::default(),
            share,
            total,
        }
    }

    /// The bytes kept for addresses that hold little.
    fn reserve(&self) -> usize {
        self.total / 4 * RESERVE_QUARTERS
    }

    /// What one address may hold once only the reserve is left.
    pub fn reserve_share(&self) -> usize {
        self.reserve() / RESERVE_SHARES
    }

    /// Takes `bytes` more for a body from `from` (added to `hold`, taken whole or not at all);
    /// refused at once when the address's share or the server's budget is spent (the caller answers
    /// 503 rather than wait or grow).
    pub fn take(
        &self,
        from: Option<IpAddr>,
        bytes: usize,
        hold: &mut Option<BodyHold>,
    ) -> Result<(), BudgetFull> {
        let n = u32::try_from(bytes).map_err(|_| BudgetFull::Server)?;
        // The address's share is checked and taken under one lock with the server's permits.
        let mut held = from.map(|_| self.by_address.lock().unwrap_or_else(|p| p.into_inner()));
        if let (Some(ip), Some(held)) = (from, held.as_ref()) {
            let mine = held.get(&ip).copied().unwrap_or(0);
            if mine + bytes > self.share {
                return Err(BudgetFull::Address { share: self.share });
            }
            let free = self.permits.available_permits();
            let others_hold = self.total - free - mine.min(self.total - free);
            if others_hold > 0
                && free.saturating_sub(bytes) < self.reserve()
                && mine + bytes > self.reserve_share()
            {
                return Err(BudgetFull::Reserve {
                    per_address: self.reserve_share(),
                });
            }
        }
        let permit = self
            .permits
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| BudgetFull::Server)?;
        if let (Some(ip), Some(held)) = (from, held.as_mut()) {
            *held.entry(ip).or_default() += bytes;
        }
        drop(held);
        self.add(hold, permit, from, bytes);
        Ok(())
    }

    fn add(
        &self,
        hold: &mut Option<BodyHold>,
        permit: OwnedSemaphorePermit,
        ip: Option<IpAddr>,
        bytes: usize,
    ) {
        match hold {
            Some(h) => {
                h._permit.merge(permit);
                h.bytes += bytes;
            }
            None => {
                *hold = Some(BodyHold {
                    _permit: permit,
                    address: ip.map(|ip| (self.by_address.clone(), ip)),
                    bytes,
                });
            }
        }
    }

    /// Bytes not held by any request now.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    /// Bytes `ip` holds now.
    pub fn held_by(&self, ip: IpAddr) -> usize {
        let held = self.by_address.lock().unwrap_or_else(|p| p.into_inner());
        held.get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for BodyHold {
    fn drop(&mut self) {
        if let Some((table, ip)) = &self.address {
            let mut held = table.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(n) = held.get_mut(ip) {
                *n = n.saturating_sub(self.bytes);
                if *n == 0 {
                    held.remove(ip);
                }
            }
        }
    }
}

/// The connection cap for a container memory limit of `bytes`: as many connections as
/// [`CONNECTION_SHARE_QUARTERS`] of it holds at [`CONNECTION_WORST_BYTES`] each (at least 16).
pub fn connections_for(memory_limit: u64) -> usize {
    let share = memory_limit / 4 * CONNECTION_SHARE_QUARTERS;
    usize::try_from(share / CONNECTION_WORST_BYTES)
        .unwrap_or(usize::MAX)
        .max(16)
}

/// The decode budget for a container memory limit of `bytes` (none known: the default).
pub fn decode_budget_for(memory_limit: Option<u64>) -> usize {
    match memory_limit {
        Some(bytes) => usize::try_from(bytes / 8 * DECODE_BUDGET_EIGHTHS)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS),
        None => DEFAULT_DECODE_BUDGET,
    }
}

/// Estimated decoded memory of the reviews in flight, as permits of one semaphore.
#[derive(Debug, Clone)]
pub struct DecodeBudget {
    permits: Arc<Semaphore>,
    total: usize,
}

/// Why a review could not be given the memory to decode.
#[derive(Debug, PartialEq, Eq)]
pub enum NoRoom {
    /// Larger than the whole budget: it can never run.
    TooLarge { estimate: usize, budget: usize },
    /// The budget stayed taken by other reviews until the deadline.
    Busy { budget: usize },
}

impl DecodeBudget {
    pub fn new(bytes: usize) -> Self {
        let total = bytes.min(Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(total)),
            total,
        }
    }

    /// Takes `estimate` from the budget, waiting for other reviews to finish until `deadline`.
    pub async fn take(
        &self,
        estimate: usize,
        deadline: tokio::time::Instant,
    ) -> Result<OwnedSemaphorePermit, NoRoom> {
        let budget = self.total;
        let n = u32::try_from(estimate)
            .ok()
            .filter(|&n| n as usize <= budget)
            .ok_or(NoRoom::TooLarge { estimate, budget })?;
        let acquire = self.permits.clone().acquire_many_owned(n);
        match tokio::time::timeout_at(deadline, acquire).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(NoRoom::Busy { budget }),
        }
    }

    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }
}

/// Requests in flight on one connection: a semaphore put into each connection's data.
#[derive(Debug, Clone)]
pub struct ConnectionStreams(pub Arc<Semaphore>);

/// What one client can cost the server (src/server/limits.rs).
#[derive(Args, Debug)]
pub struct LimitFlags {
    /// Largest admission request body accepted, in bytes (larger gets HTTP 413).
    #[arg(long, env = "KOORD_WEBHOOK_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_request_bytes: usize,
    /// Request bytes held in memory at once over all connections; beyond it HTTP 503 at once.
    #[arg(long, env = "KOORD_WEBHOOK_MAX_INFLIGHT_REQUEST_BYTES", default_value_t = DEFAULT_MAX_INFLIGHT_BYTES)]
    pub max_inflight_request_bytes: usize,
    /// Time a client has to send a whole body (the API server's `?timeout=` shortens it); HTTP 408
    /// after it.
    #[arg(long, env = "KOORD_WEBHOOK_REQUEST_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration_arg)]
    pub request_read_timeout: Duration,
    /// Longest pause between two pieces of one request body; HTTP 408 after it (a body the caller
    /// stops sending holds its bytes for nothing).
    #[arg(long, env = "KOORD_WEBHOOK_REQUEST_BODY_IDLE_TIMEOUT", default_value = "2s", value_parser = parse_duration_arg)]
    pub request_body_idle_timeout: Duration,
    /// Requests in flight on one connection; more get HTTP 503 (HTTP/2, which let one connection
    /// carry many, is refused in the TLS handshake).
    #[arg(long, env = "KOORD_WEBHOOK_MAX_STREAMS_PER_CONNECTION", default_value_t = DEFAULT_MAX_STREAMS_PER_CONNECTION)]
    pub max_streams_per_connection: usize,
    /// Open connections over all workers; more wait in the listen backlog. With --memory-limit, no
    /// more than a quarter of it holds at 160 KiB each (the most one connection can hold).
    #[arg(long, env = "KOORD_WEBHOOK_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Open connections from one client address (never more than --max-connections);
    /// a connection over it is closed at accept.
    #[arg(long, env = "KOORD_WEBHOOK_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS)]
    pub max_connections_per_address: usize,
    /// Memory the reviews in flight may take once decoded, estimated from each body's shape before
    /// decoding; a review waits for room until its deadline (then 503). Default: 3/8 of
    /// --memory-limit, or 96 MiB.
    #[arg(long, env = "KOORD_WEBHOOK_DECODE_MEMORY_BUDGET")]
    pub decode_memory_budget: Option<usize>,
    /// The container's memory limit in bytes (the chart sets it from the Downward API); the decode
    /// budget is derived from it.
    #[arg(long, env = "KOORD_WEBHOOK_MEMORY_LIMIT")]
    pub memory_limit: Option<u64>,
    /// HTTP worker threads (default: the cores, at least 2, whatever the CPU limit).
    #[arg(long, env = "KOORD_WEBHOOK_WORKERS")]
    pub workers: Option<usize>,
}

impl LimitFlags {
    /// `--max-connections`, and with a memory limit no more than its connection share holds.
    fn max_connections(&self) -> usize {
        self.memory_limit
            .map_or(self.max_connections, |l| {
                self.max_connections.min(connections_for(l))
            })
            .max(1)
    }

    pub fn limits(&self) -> Limits {
        Limits {
            max_body_bytes: self.max_request_bytes,
            // The raw bytes held while reading: a quarter of the memory limit at most.
            max_inflight_bytes: self
                .memory_limit
                .map_or(self.max_inflight_request_bytes, |l| {
                    self.max_inflight_request_bytes
                        .min(usize::try_from(l / 4).unwrap_or(usize::MAX))
                }),
            read_timeout: self.request_read_timeout,
            body_idle_timeout: self.request_body_idle_timeout,
            max_streams_per_connection: self.max_streams_per_connection,
            max_connections: self.max_connections(),
            // Never more than the connections (the API server, one address, opens one per call in
            // flight: 200 concurrent creates took more than 154 on the real node).
            max_connections_per_address: self
                .max_connections_per_address
                .min(self.max_connections())
                .max(1),
            decode_budget: self
                .decode_memory_budget
                .unwrap_or_else(|| decode_budget_for(self.memory_limit)),
            workers: self.workers.unwrap_or_else(default_workers),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_at_their_worst_hold_a_quarter_of_the_memory_limit() {
        use clap::Parser;
        #[derive(Parser)]
        struct Flags {
            #[command(flatten)]
            limits: LimitFlags,
        }
        let limits = |args: &[&str]| {
            Flags::parse_from(std::iter::once("serve").chain(args.iter().copied()))
                .limits
                .limits()
        };
        for mib in [64u64, 384, 1024, 4096] {
            let bytes = mib << 20;
            let l = limits(&["--memory-limit", &bytes.to_string()]);
            let worst = l.max_connections as u64 * CONNECTION_WORST_BYTES;
            assert!(
                worst <= bytes / 4,
                "{mib} MiB: {} connections",
                l.max_connections
            );
            assert!(l.max_connections_per_address <= l.max_connections);
            assert!(l.max_connections_per_address >= 1);
        }
        let chart = limits(&["--memory-limit", &(384u64 << 20).to_string()]);
        assert_eq!(
            (chart.max_connections, chart.max_connections_per_address),
            (614, 256)
        );
        // Without a limit, the flags as given; a lower flag is kept under a limit.
        let plain = limits(&[]);
        assert_eq!(
            (plain.max_connections, plain.max_connections_per_address),
            (DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_ADDRESS)
        );
        let low = limits(&["--memory-limit", "1073741824", "--max-connections", "100"]);
        assert_eq!(
            (low.max_connections, low.max_connections_per_address),
            (100, 100)
        );
    }

    #[test]
    fn the_budget_is_returned_when_a_request_ends() {
        let budget = BodyBudget::new(100, 100);
        let (mut a, mut b) = (None, None);
        budget.take(None, 60, &mut a).unwrap();
        assert_eq!(budget.take(None, 60, &mut b), Err(BudgetFull::Server));
        assert!(b.is_none(), "only 40 left");
        budget.take(None, 40, &mut b).unwrap();
        assert_eq!(budget.available(), 0);
        drop((a, b));
        assert_eq!(budget.available(), 100);
        assert!(default_workers() >= 2);
    }

    #[test]
    fn one_address_holds_its_share_and_no_more() {
        let budget = BodyBudget::new(100, 30);
        let (greedy, other) = (IpAddr::from([10, 0, 0, 9]), IpAddr::from([10, 0, 0, 1]));
        let (mut first, mut second, mut theirs) = (None, None, None);
        budget.take(Some(greedy), 20, &mut first).unwrap();
        budget.take(Some(greedy), 10, &mut first).unwrap();
        assert_eq!(
            budget.take(Some(greedy), 1, &mut second),
            Err(BudgetFull::Address { share: 30 })
        );
        assert_eq!(budget.held_by(greedy), 30);
        // Everyone else still has the rest.
        budget.take(Some(other), 30, &mut theirs).unwrap();
        assert_eq!(budget.available(), 40);
        drop(first);
        assert_eq!(budget.held_by(greedy), 0);
        budget.take(Some(greedy), 30, &mut second).unwrap();
        // The share is a quarter of the bytes, but at least one body of the largest size.
        let limits = |inflight, body| Limits {
            max_inflight_bytes: inflight,
            max_body_bytes: body,
            ..Limits::default()
        };
        assert_eq!(limits(64 << 20, 8 << 20).address_share(), 16 << 20);
        assert_eq!(limits(16 << 20, 8 << 20).address_share(), 8 << 20);
        assert_eq!(limits(4 << 20, 8 << 20).address_share(), 4 << 20);
    }

    proptest::proptest! {
        /// However up to four addresses take the bytes (each up to its share, in any order and
        /// size), a fifth address can still take a review of ordinary size: the reserve holds.
        #[test]
        fn several_addresses_at_their_share_leave_room_for_another(
            takes in proptest::collection::vec((0u8..4, 1usize..(16 << 20)), 1..40)
        ) {
            let limits = Limits::default();
            let budget = BodyBudget::new(limits.max_inflight_bytes, limits.address_share());
            let mut holds: Vec<Option<BodyHold>> = (0..4).map(|_| None).collect();
            for (who, bytes) in takes {
                let ip = IpAddr::from([10, 0, 0, who]);
                let _ = budget.take(Some(ip), bytes, &mut holds[usize::from(who)]);
                proptest::prop_assert!(budget.held_by(ip) <= limits.address_share());
            }
            let mut theirs = None;
            let other = IpAddr::from([10, 0, 1, 1]);
            proptest::prop_assert_eq!(budget.take(Some(other), 256 << 10, &mut theirs), Ok(()));
            proptest::prop_assert!(budget.reserve_share() >= 1 << 20);
        }
    }

    #[test]
    fn a_lone_address_may_use_the_reserve() {
        // A budget smaller than a body: one caller alone still gets all of it.
        let budget = BodyBudget::new(4 << 20, 4 << 20);
        let mut hold = None;
        let ip = IpAddr::from([10, 0, 0, 1]);
        assert_eq!(budget.take(Some(ip), 4 << 20, &mut hold), Ok(()));
    }

    #[test]
    fn the_decode_budget_is_three_eighths_of_the_memory_limit() {
        assert_eq!(decode_budget_for(Some(256 << 20)), 96 << 20);
        assert_eq!(decode_budget_for(None), DEFAULT_DECODE_BUDGET);
    }

    #[tokio::test]
    async fn the_decode_budget_waits_until_the_deadline_and_refuses_what_never_fits() {
        let budget = DecodeBudget::new(100);
        let soon = || tokio::time::Instant::now() + std::time::Duration::from_millis(50);
        assert_eq!(
            budget.take(101, soon()).await.unwrap_err(),
            NoRoom::TooLarge {
                estimate: 101,
                budget: 100
            }
        );
        let first = budget.take(70, soon()).await.unwrap();
        assert_eq!(
            budget.take(70, soon()).await.unwrap_err(),
            NoRoom::Busy { budget: 100 }
        );
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move {
                budget
                    .take(
                        70,
                        tokio::time::Instant::now() + std::time::Duration::from_secs(5),
                    )
                    .await
                    .is_ok()
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        drop(first);
        assert!(waiting.await.unwrap(), "a review waits for one that ends");
        assert_eq!(budget.available(), 100);
    }
}
