//! Leader election on a coordination.k8s.io Lease: one replica writes, all serve.
//!
//! The holder renews every `renew`; others take over once `lease` has passed since the last renewal.
//! Updates carry the resourceVersion read, so two candidates cannot both win. Losing the Lease (or
//! failing to renew it within `lease`) ends leadership at once.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;

use crate::install::NAMESPACE;
use crate::install::rbac::LEASE_NAME;

#[derive(Debug, Clone, Copy)]
pub struct LeaseTimings {
    pub lease: Duration,
    pub renew: Duration,
    pub retry: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(15),
            renew: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

/// Whether the lease is free for `identity` to take at this moment.
fn takeable(spec: &LeaseSpec, identity: &str, lease: Duration) -> bool {
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == identity {
        return true;
    }
    let duration = spec
        .lease_duration_seconds
        .map_or(lease, |s| Duration::from_secs(s.max(0) as u64));
    match spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) {
        Some(renewed) => {
            let age = jiff::Timestamp::now().duration_since(renewed.0);
            age.as_secs_f64() > duration.as_secs_f64()
        }
        None => true,
    }
}

/// One attempt to acquire or renew. `Ok(true)`: we hold the lease now.
async fn try_acquire(
    api: &Api<Lease>,
    identity: &str,
    timings: LeaseTimings,
) -> kube::Result<bool> {
    let lease_seconds = timings.lease.as_secs().max(1) as i32;
    let Some(mut lease) = api.get_opt(LEASE_NAME).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(LEASE_NAME.to_owned()),
                namespace: Some(NAMESPACE.to_owned()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.to_owned()),
                lease_duration_seconds: Some(lease_seconds),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    if !takeable(spec, identity, timings.lease) {
        return Ok(false);
    }
    if spec.holder_identity.as_deref() != Some(identity) {
        spec.holder_identity = Some(identity.to_owned());
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(lease_seconds);
    match api
        .replace(LEASE_NAME, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up so a follower takes over without waiting for it to expire.
pub async fn release(api: &Api<Lease>, identity: &str) -> kube::Result<()> {
    let Some(mut lease) = api.get_opt(LEASE_NAME).await? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    if spec.holder_identity.as_deref() != Some(identity) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    spec.acquire_time = None;
    api.replace(LEASE_NAME, &PostParams::default(), &lease)
        .await?;
    Ok(())
}

/// Runs the election until `stop` fires; `leader` tells whether this replica holds the Lease.
pub async fn run(
    api: Api<Lease>,
    identity: String,
    timings: LeaseTimings,
    leader: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut last_renewal = tokio::time::Instant::now();
    loop {
        let holding = *leader.borrow();
        match try_acquire(&api, &identity, timings).await {
            Ok(true) => {
                last_renewal = tokio::time::Instant::now();
                if !holding {
                    tracing::info!(%identity, "became the leader");
                    leader.send_replace(true);
                }
            }
            Ok(false) => {
                if holding {
                    tracing::warn!(%identity, "lost the lease to another replica");
                    leader.send_replace(false);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "lease renewal failed");
                if holding && last_renewal.elapsed() >= timings.lease {
                    tracing::warn!("could not renew the lease in time; no longer the leader");
                    leader.send_replace(false);
                }
            }
        }
        let wait = if *leader.borrow() {
            timings.renew
        } else {
            timings.retry
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => break,
        }
    }
    if *leader.borrow() {
        leader.send_replace(false);
        if let Err(e) = release(&api, &identity).await {
            tracing::warn!(error = %e, "could not release the lease");
        } else {
            tracing::info!("lease released");
        }
    }
}
