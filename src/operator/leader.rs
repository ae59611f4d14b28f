//! Leader election on a coordination.k8s.io Lease: one replica writes, all serve.
//!
//! The semantics are client-go's (`tools/leaderelection`), so a Go operator's users find what they
//! know:
//! - every replica tries to acquire or renew every `retry` period;
//! - a replica may take the Lease from another holder only once the Lease record has not changed for
//!   `lease`, measured on its own monotonic clock from the moment it saw the record change (never by
//!   comparing the holder's `renewTime` with the local clock: clock skew between nodes does not
//!   matter);
//! - the holder gives leadership up when `renew_deadline` (shorter than `lease`) passes without a
//!   successful renewal, so it has stopped writing before anybody else may take over;
//! - every API call of the election has a timeout, so a hung call cannot keep a stale leader.
//!
//! Writes that only the leader may make check [`Leadership::check`] right before they are sent
//! (fencing): a replica that was paused (SIGSTOP, a long GC-like stall, a partition) and resumes
//! after its deadline finds itself no longer leader before it writes anything.
//!
//! Why not the `kube-lease-manager` crate: it judges expiry from the holder's timestamps against the
//! local clock (with a configured skew allowance) and has no notion of a renew deadline distinct from
//! the lease duration, which are the two behaviours this module exists to get right.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::names::LEASE;
use crate::names::namespace;

#[derive(Debug, Clone, Copy)]
pub struct LeaseTimings {
    /// How long followers wait, after the record last changed, before they take the Lease.
    pub lease: Duration,
    /// How long the holder keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// The interval between attempts to acquire or renew.
    pub retry: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

impl LeaseTimings {
    /// client-go's constraints: the holder must give up before followers may take over, and must
    /// get several tries within its deadline.
    pub fn validate(&self) -> Result<(), String> {
        if self.renew_deadline >= self.lease {
            return Err(format!(
                "--lease-renew-deadline ({:?}) must be shorter than --lease-duration ({:?})",
                self.renew_deadline, self.lease
            ));
        }
        if self.retry.is_zero() || self.retry >= self.renew_deadline {
            return Err(format!(
                "--lease-retry-period ({:?}) must be positive and shorter than \
                 --lease-renew-deadline ({:?})",
                self.retry, self.renew_deadline
            ));
        }
        Ok(())
    }

    /// The timeout of each API call of the election: half the renew deadline, at least a second.
    fn call_timeout(&self) -> Duration {
        (self.renew_deadline / 2).max(Duration::from_secs(1))
    }
}

/// Why a leader-only write was not sent.
#[derive(Debug, thiserror::Error)]
#[error("not the leader (or the leadership could not be renewed in time); write not sent")]
pub struct NotLeader;

/// Whether this replica leads, as the leader's writers check it.
#[derive(Clone, Debug)]
pub struct Leadership {
    state: watch::Receiver<bool>,
    /// The sender of a replica that always leads, kept so `changed` waits rather than fails.
    _always: Option<Arc<watch::Sender<bool>>>,
    /// Local time of the last successful acquire or renew; `None` while not leading.
    renewed: Arc<Mutex<Option<Instant>>>,
    renew_deadline: Duration,
}

impl Leadership {
    /// A replica that always leads (`--leader-elect=false`).
    pub fn always() -> Self {
        let (tx, state) = watch::channel(true);
        Self {
            state,
            _always: Some(Arc::new(tx)),
            renewed: Arc::new(Mutex::new(None)),
            renew_deadline: Duration::MAX,
        }
    }

    /// Leading now: elected, and renewed within the renew deadline. The election loop updates the
    /// state every retry period; the time check also covers a process that was paused and has not
    /// yet run its loop again.
    pub fn is_leader(&self) -> bool {
        if !*self.state.borrow() {
            return false;
        }
        if self.renew_deadline == Duration::MAX {
            return true;
        }
        let renewed = *self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        renewed.is_some_and(|t| t.elapsed() < self.renew_deadline)
    }

    /// The fence every leader-only write passes right before it is sent.
    pub fn check(&self) -> Result<(), NotLeader> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(NotLeader)
        }
    }

    /// Waits until leadership is gained or lost.
    pub async fn changed(&mut self) {
        if self.state.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The side the election loop writes.
struct Leading {
    state: watch::Sender<bool>,
    renewed: Arc<Mutex<Option<Instant>>>,
}

impl Leading {
    fn set(&self, renewed: Option<Instant>) {
        *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) = renewed;
        self.state.send_if_modified(|leading| {
            let changed = *leading != renewed.is_some();
            *leading = renewed.is_some();
            changed
        });
    }

    fn renewed(&self) -> Option<Instant> {
        *self.renewed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// With leader election, [`election`]; without, this replica leads alone and elects nothing.
pub fn election_if(elect: bool, timings: LeaseTimings) -> (Leadership, Option<Election>) {
    match elect {
        true => {
            let (leadership, election) = election(timings);
            (leadership, Some(election))
        }
        false => (Leadership::always(), None),
    }
}

/// A new election's two sides: the handle writers check, and the loop that keeps it.
pub fn election(timings: LeaseTimings) -> (Leadership, Election) {
    let (tx, rx) = watch::channel(false);
    let renewed = Arc::new(Mutex::new(None));
    let leadership = Leadership {
        state: rx,
        _always: None,
        renewed: renewed.clone(),
        renew_deadline: timings.renew_deadline,
    };
    let election = Election {
        leading: Leading { state: tx, renewed },
        timings,
        observed: None,
    };
    (leadership, election)
}

/// What of a Lease decides who holds it; a change of any of it restarts the followers' wait.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    holder: String,
    duration_seconds: Option<i32>,
    acquire_time: Option<String>,
    renew_time: Option<String>,
    transitions: Option<i32>,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Self {
        let time = |t: &Option<MicroTime>| t.as_ref().map(|t| t.0.to_string());
        Self {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            duration_seconds: spec.lease_duration_seconds,
            acquire_time: time(&spec.acquire_time),
            renew_time: time(&spec.renew_time),
            transitions: spec.lease_transitions,
        }
    }
}

/// The election loop's state.
pub struct Election {
    leading: Leading,
    timings: LeaseTimings,
    /// The last Lease record seen and the local time it was first seen.
    observed: Option<(Record, Instant)>,
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

impl Election {
    /// Notes `record` as seen now if it differs from the last one seen.
    fn observe(&mut self, record: Record) {
        if self.observed.as_ref().map(|(r, _)| r) != Some(&record) {
            self.observed = Some((record, Instant::now()));
        }
    }

    /// Whether another holder's claim still stands: its record changed less than its lease duration
    /// ago, on our clock.
    fn held_by_other(&self, identity: &str) -> bool {
        let Some((record, seen)) = &self.observed else {
            return false;
        };
        if record.holder.is_empty() || record.holder == identity {
            return false;
        }
        let duration = record
            .duration_seconds
            .map_or(self.timings.lease, |s| Duration::from_secs(s.max(0) as u64));
        seen.elapsed() < duration
    }

    /// One attempt to acquire or renew. `Ok(true)`: we hold the Lease now.
    async fn try_acquire_or_renew(
        &mut self,
        api: &Api<Lease>,
        identity: &str,
    ) -> kube::Result<bool> {
        let lease_seconds = self.timings.lease.as_secs().max(1) as i32;
        let Some(mut lease) = api.get_opt(LEASE).await? else {
            let spec = LeaseSpec {
                holder_identity: Some(identity.to_owned()),
                lease_duration_seconds: Some(lease_seconds),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..Default::default()
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE.to_owned()),
                    namespace: Some(namespace().to_owned()),
                    ..Default::default()
                },
                spec: Some(spec.clone()),
            };
            return match api.create(&crate::names::post_params(), &lease).await {
                Ok(_) => {
                    self.observe(Record::of(&spec));
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        self.observe(Record::of(spec));
        if self.held_by_other(identity) {
            return Ok(false);
        }
        if spec.holder_identity.as_deref() != Some(identity) {
            spec.holder_identity = Some(identity.to_owned());
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(now());
        spec.lease_duration_seconds = Some(lease_seconds);
        let record = Record::of(spec);
        // The resourceVersion read goes with the update: of two candidates only one wins.
        match api
            .replace(LEASE, &crate::names::post_params(), &lease)
            .await
        {
            Ok(_) => {
                self.observe(record);
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One round: an attempt bounded by the call timeout, then the renew deadline enforced.
    async fn round(&mut self, api: &Api<Lease>, identity: &str) {
        let leading = self.leading.renewed().is_some();
        let attempt = tokio::time::timeout(
            self.timings.call_timeout(),
            self.try_acquire_or_renew(api, identity),
        )
        .await;
        match attempt {
            Ok(Ok(true)) => {
                if !leading {
                    tracing::info!(%identity, "became the leader");
                }
                self.leading.set(Some(Instant::now()));
                return;
            }
            Ok(Ok(false)) => {
                if leading {
                    tracing::warn!(%identity, "the Lease is held by another replica; no longer the leader");
                    self.leading.set(None);
                }
                return;
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "lease acquire/renew failed"),
            Err(_) => tracing::warn!(
                timeout = ?self.timings.call_timeout(),
                "lease acquire/renew timed out"
            ),
        }
        if self
            .leading
            .renewed()
            .is_some_and(|t| t.elapsed() >= self.timings.renew_deadline)
        {
            tracing::warn!(
                deadline = ?self.timings.renew_deadline,
                "could not renew the Lease within the renew deadline; no longer the leader"
            );
            self.leading.set(None);
        }
    }

    /// Runs the election until `stop` fires, then gives the Lease up if it holds it.
    pub async fn run(mut self, api: Api<Lease>, identity: String, mut stop: watch::Receiver<bool>) {
        loop {
            self.round(&api, &identity).await;
            tokio::select! {
                _ = tokio::time::sleep(self.timings.retry) => {}
                _ = stop.changed() => break,
            }
        }
        if self.leading.renewed().is_some() {
            self.leading.set(None);
            let released =
                tokio::time::timeout(self.timings.call_timeout(), release(&api, &identity)).await;
            match released {
                Ok(Ok(())) => tracing::info!("lease released"),
                Ok(Err(e)) => tracing::warn!(error = %e, "could not release the lease"),
                Err(_) => tracing::warn!("releasing the lease timed out"),
            }
        }
    }
}

/// Gives the Lease up so a follower takes over without waiting for it to expire.
pub async fn release(api: &Api<Lease>, identity: &str) -> kube::Result<()> {
    let Some(mut lease) = api.get_opt(LEASE).await? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    if spec.holder_identity.as_deref() != Some(identity) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    spec.acquire_time = None;
    api.replace(LEASE, &crate::names::post_params(), &lease)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, renew: &str) -> Record {
        Record {
            holder: holder.to_owned(),
            duration_seconds: Some(15),
            acquire_time: None,
            renew_time: Some(renew.to_owned()),
            transitions: Some(0),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn another_holder_is_waited_for_on_the_local_clock() {
        let (_, mut e) = election(LeaseTimings::default());
        // The record's timestamps are never compared with our clock: one far in the past or the
        // future counts from the moment we saw it.
        e.observe(record("other", "1970-01-01T00:00:00Z"));
        assert!(e.held_by_other("me"));
        tokio::time::advance(Duration::from_secs(14)).await;
        e.observe(record("other", "1970-01-01T00:00:00Z"));
        assert!(e.held_by_other("me"), "unchanged for 14 s of 15");
        // A renewal restarts the wait.
        e.observe(record("other", "2999-01-01T00:00:00Z"));
        tokio::time::advance(Duration::from_secs(14)).await;
        assert!(e.held_by_other("me"));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!e.held_by_other("me"), "unchanged for 15 s: takeable");
        assert!(!e.held_by_other("other"), "our own record never blocks us");
        e.observe(record("", "2999-01-01T00:00:00Z"));
        assert!(!e.held_by_other("me"), "a released Lease is free");
    }

    #[tokio::test(start_paused = true)]
    async fn leadership_ends_at_the_renew_deadline_even_before_the_loop_runs() {
        let timings = LeaseTimings::default();
        let (leadership, e) = election(timings);
        assert!(leadership.check().is_err());
        e.leading.set(Some(Instant::now()));
        assert!(leadership.check().is_ok());
        // Paused past the deadline: the fence closes by itself, with the state still "leading".
        tokio::time::advance(timings.renew_deadline).await;
        assert!(*leadership.state.borrow());
        assert!(leadership.check().is_err());
        assert!(Leadership::always().check().is_ok());
    }

    #[test]
    fn timings_follow_client_go_constraints() {
        assert!(LeaseTimings::default().validate().is_ok());
        let bad = LeaseTimings {
            renew_deadline: Duration::from_secs(15),
            ..Default::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .contains("--lease-renew-deadline")
        );
        let bad = LeaseTimings {
            retry: Duration::from_secs(10),
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("--lease-retry-period"));
    }
}
