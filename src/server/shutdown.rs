//! What a stopping replica does, and how long each step may take: the one place that knows, so the
//! Pod's `terminationGracePeriodSeconds` (both installs) is derived from it instead of being a
//! number nothing checks against the drain.
//!
//! On SIGTERM, in order:
//! 1. **Drain** (`--drain-delay`, cluster mode only): unready, still answering, each answer closing
//!    its connection (`drain.rs`), while the API server's endpoints catch up with the Pod's deletion.
//! 2. **Release the Lease**: the operator is told to stop and given [`LEASE_RELEASE_PAUSE`] to
//!    hand the Lease back, so a successor need not wait for it to expire.
//! 3. **Stop the listeners** (admission and operations ports at once): no new connection; requests
//!    in flight get up to [`IN_FLIGHT_TIMEOUT`].
//!
//! The kubelet kills the container [`grace_period`] after SIGTERM: longer than the three together.

use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use clap::Args;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::duration::parse_duration_arg;
use crate::state::State;

/// `--drain-delay`'s default, as clap and the tests read it.
pub const DEFAULT_DRAIN_DELAY: &str = "10s";

/// How long requests in flight may take once the listeners stop accepting (actix's shutdown timeout):
/// the API server's own timeout for a call is at most 30 s, a review takes milliseconds.
pub const IN_FLIGHT_TIMEOUT: Duration = Duration::from_secs(10);

/// The election's moment to release the Lease before the runtime goes away.
pub const LEASE_RELEASE_PAUSE: Duration = Duration::from_millis(300);

/// Beyond the steps' own bounds: the process's exit, a slow node.
const SLACK: Duration = Duration::from_secs(9);

/// The flags of a replica's shutdown.
#[derive(Args, Debug, Clone)]
pub struct ShutdownFlags {
    /// On SIGTERM, keep serving this long before closing the listener: the API server routes by
    /// EndpointSlices, which on a busy control plane follow a Pod's deletion by several seconds.
    /// The installs' terminationGracePeriodSeconds follow it.
    #[arg(long, env = "KOORD_WEBHOOK_DRAIN_DELAY", default_value = DEFAULT_DRAIN_DELAY, value_parser = parse_duration_arg)]
    pub drain_delay: Duration,
}

/// The Pod's `terminationGracePeriodSeconds` for a drain of `drain_delay`: every step's bound and
/// some slack, in whole seconds (30 with the default drain).
pub fn grace_period(drain_delay: Duration) -> i64 {
    let total = drain_delay + LEASE_RELEASE_PAUSE + IN_FLIGHT_TIMEOUT + SLACK;
    total.as_secs_f64().ceil() as i64
}

/// `--drain-delay`'s default as a duration.
pub fn default_drain_delay() -> Duration {
    parse_duration_arg(DEFAULT_DRAIN_DELAY).expect("the default drain delay parses")
}

/// What a serving replica stops on SIGTERM.
pub struct Stopping {
    pub state: Arc<State>,
    /// The operator's stop signal, when one runs (cluster mode): then the replica drains first.
    pub operator: Option<watch::Sender<bool>>,
    pub admission: ServerHandle,
    pub ops: Option<ServerHandle>,
    /// Tasks with nothing to finish (the probe port, the operator once told to stop).
    pub tasks: Vec<AbortHandle>,
}

impl Stopping {
    /// The steps of the module's doc, in order.
    pub async fn run(self, flags: &ShutdownFlags) {
        // The API server may still route to this replica for a moment: keep answering, each
        // answer closing its connection (`drain.rs`), then stop.
        self.state.draining.start();
        if let Some(operator) = &self.operator {
            tracing::info!(delay = ?flags.drain_delay, "terminating: draining");
            self.state
                .readiness
                .set_not_ready("shutdown", "terminating");
            tokio::time::sleep(flags.drain_delay).await;
            let _ = operator.send(true);
            tokio::time::sleep(LEASE_RELEASE_PAUSE).await;
        }
        // Both within the same bound, at once.
        let ops = async {
            if let Some(ops) = &self.ops {
                ops.stop(true).await;
            }
        };
        tokio::join!(self.admission.stop(true), ops);
        for task in self.tasks {
            task.abort();
        }
        tracing::info!("stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_period_covers_every_step_and_follows_the_drain() {
        assert_eq!(grace_period(default_drain_delay()), 30);
        for drain in [0, 1, 10, 25, 60, 300] {
            let drain = Duration::from_secs(drain);
            let grace = Duration::from_secs(grace_period(drain) as u64);
            assert!(
                grace >= drain + LEASE_RELEASE_PAUSE + IN_FLIGHT_TIMEOUT,
                "{drain:?}"
            );
        }
        // A drain of 25 s, which the old fixed 30 s cut short.
        assert_eq!(grace_period(Duration::from_secs(25)), 45);
        assert_eq!(grace_period(Duration::from_millis(500)), 20);
    }
}
