//! Which pod templates the replicas of this install run, watched, so that the leader registers
//! `--qos-split` only while no other template runs (docs/narrowing.md).
//!
//! Why: a release from before the split removes its labelled parts as entries it does not know and
//! keeps the entries' objectSelector (it does not own that field), so pods carrying the QoS label
//! would reach neither webhook. Such a release leads only while one of its replicas runs, that is
//! during a rollout to or from it. During any rollout (another template beside this one) the leader
//! writes the pod entries whole, which every release keeps; once the rollout is over it splits them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{Notify, watch};

use crate::names::namespace;

/// The label every release's manifests and chart select their replicas by (a Deployment's
/// selector cannot change, so an older release's replicas carry it too).
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
/// Set by the Deployment controller on each pod: which template (ReplicaSet) it runs.
pub const TEMPLATE_LABEL: &str = "pod-template-hash";

/// What the leader knows of the replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replicas {
    /// Not read yet.
    Unread,
    /// There are no others to be seen: this process is not a pod of a Deployment (a host process
    /// in URL mode, a test), or its pod lacks the labels to find them by. Why, for the log.
    Unseen(&'static str),
    /// Every replica runs this pod's template.
    Settled,
    /// A replica runs another template (a rollout is under way): its name.
    Rolling { pod: String },
}

impl Replicas {
    /// Whether the pod entries may be split now.
    pub fn allow_split(&self) -> bool {
        matches!(self, Replicas::Unseen(_) | Replicas::Settled)
    }
}

/// This replica's place: the template it runs and the Deployment that owns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Own {
    pub name_label: String,
    pub template: String,
    pub deployment: String,
}

/// What is kept of a replica's pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    template: Option<String>,
    deployment: Option<String>,
    finished: bool,
}

/// The Deployment a pod belongs to: its controlling ReplicaSet is named `<deployment>-<template>`.
fn deployment_of(pod: &Pod) -> Option<String> {
    let template = pod.labels().get(TEMPLATE_LABEL)?;
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "ReplicaSet")?;
    owner
        .name
        .strip_suffix(template.as_str())?
        .strip_suffix('-')
        .map(str::to_owned)
}

impl Own {
    /// This replica's place, or why the others cannot be found from its pod.
    pub fn of(pod: &Pod) -> Result<Own, &'static str> {
        let name_label = pod
            .labels()
            .get(NAME_LABEL)
            .ok_or("its pod has no app.kubernetes.io/name label")?;
        let template = pod
            .labels()
            .get(TEMPLATE_LABEL)
            .ok_or("its pod has no pod-template-hash label (not run by a Deployment)")?;
        let deployment = deployment_of(pod).ok_or("its pod is not controlled by a ReplicaSet")?;
        Ok(Own {
            name_label: name_label.clone(),
            template: template.clone(),
            deployment,
        })
    }
}

impl Replica {
    pub fn of(pod: &Pod) -> Replica {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        Replica {
            template: pod.labels().get(TEMPLATE_LABEL).cloned(),
            deployment: deployment_of(pod),
            finished: matches!(phase, Some("Succeeded" | "Failed")),
        }
    }
}

/// The verdict on the pods carrying this install's name label: pods of other Deployments (another
/// install in the namespace) and finished ones (evicted) do not count; a terminating one does (it
/// may still hold the Lease).
pub fn verdict<'a>(
    own: &Own,
    pods: impl IntoIterator<Item = (&'a String, &'a Replica)>,
) -> Replicas {
    let other = pods.into_iter().find(|(_, replica)| {
        !replica.finished
            && replica.deployment.as_deref() == Some(own.deployment.as_str())
            && replica.template.as_deref() != Some(own.template.as_str())
    });
    match other {
        Some((pod, _)) => Replicas::Rolling { pod: pod.clone() },
        None => Replicas::Settled,
    }
}

/// Follows this install's replicas into `tx`, kicking the leader's loop whenever the verdict changes.
pub async fn watch(
    client: Client,
    identity: String,
    tx: watch::Sender<Replicas>,
    kick: Arc<Notify>,
) {
    let api: Api<Pod> = Api::namespaced(client, namespace());
    let own = loop {
        match api.get_opt(&identity).await {
            Ok(Some(pod)) => break Own::of(&pod),
            Ok(None) => break Err("it is not a pod in its namespace"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read this replica's pod; retrying");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    let own = match own {
        Ok(own) => own,
        Err(why) => {
            tracing::info!(%why, "other replicas cannot be seen: --qos-split follows the flag alone");
            tx.send_replace(Replicas::Unseen(why));
            kick.notify_waiters();
            return;
        }
    };
    let config = watcher::Config::default().labels(&format!("{NAME_LABEL}={}", own.name_label));
    let mut events = watcher::watcher(api, config).default_backoff().boxed();
    let mut pods: BTreeMap<String, Replica> = BTreeMap::new();
    let mut relisting: Option<BTreeMap<String, Replica>> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(pod)) => {
                pods.insert(pod.name_any(), Replica::of(&pod));
            }
            Ok(Event::Delete(pod)) => {
                pods.remove(&pod.name_any());
            }
            Ok(Event::Init) => relisting = Some(BTreeMap::new()),
            Ok(Event::InitApply(pod)) => {
                if let Some(relisting) = relisting.as_mut() {
                    relisting.insert(pod.name_any(), Replica::of(&pod));
                }
                continue;
            }
            Ok(Event::InitDone) => pods = relisting.take().unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %e, "watch of this install's pods failed; resuming");
                continue;
            }
        }
        let now = verdict(&own, &pods);
        if *tx.borrow() != now {
            match &now {
                Replicas::Rolling { pod } => tracing::info!(
                    %pod,
                    "a replica runs another pod template (a rollout): the pod entries are written whole until it is gone"
                ),
                _ => tracing::info!("every replica runs this pod template"),
            }
            tx.send_replace(now);
            kick.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, template: &str, owner: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name,
                "labels": {NAME_LABEL: "koord-webhook", TEMPLATE_LABEL: template},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner,
                    "uid": "u", "controller": true}]},
            "status": {"phase": phase}}))
        .unwrap()
    }

    fn replicas(pods: &[Pod]) -> BTreeMap<String, Replica> {
        pods.iter()
            .map(|p| (p.name_any(), Replica::of(p)))
            .collect()
    }

    #[test]
    fn a_replica_of_another_template_holds_the_split_until_it_is_gone() {
        let me = pod("kw-new-a", "new", "koord-webhook-new", "Running");
        let own = Own::of(&me).unwrap();
        assert_eq!(own.deployment, "koord-webhook");
        let sibling = pod("kw-new-b", "new", "koord-webhook-new", "Running");
        let old = pod("kw-old-a", "old", "koord-webhook-old", "Running");
        assert_eq!(
            verdict(&own, &replicas(&[me.clone(), sibling.clone()])),
            Replicas::Settled
        );
        let rolling = verdict(&own, &replicas(&[me.clone(), sibling, old]));
        assert_eq!(
            rolling,
            Replicas::Rolling {
                pod: "kw-old-a".into()
            }
        );
        assert!(!rolling.allow_split());
        assert!(Replicas::Settled.allow_split());
        assert!(!Replicas::Unread.allow_split());
    }

    #[test]
    fn finished_pods_and_other_deployments_do_not_count() {
        let me = pod("kw-new-a", "new", "koord-webhook-new", "Running");
        let own = Own::of(&me).unwrap();
        let evicted = pod("kw-old-a", "old", "koord-webhook-old", "Failed");
        // A shadow install's Deployment in the same namespace: a longer name, same prefix.
        let shadow = pod("kws-a", "abc", "koord-webhook-shadow-abc", "Running");
        let pending = pod("kw-old-b", "old", "koord-webhook-old", "Pending");
        assert_eq!(
            verdict(&own, &replicas(&[me.clone(), evicted, shadow])),
            Replicas::Settled
        );
        assert_eq!(
            verdict(&own, &replicas(&[me, pending])),
            Replicas::Rolling {
                pod: "kw-old-b".into()
            }
        );
    }

    #[test]
    fn a_pod_without_a_deployment_sees_no_replicas() {
        let bare: Pod = serde_json::from_value(json!({
            "metadata": {"name": "x", "labels": {NAME_LABEL: "koord-webhook"}}}))
        .unwrap();
        assert!(Own::of(&bare).is_err());
        let unlabelled: Pod = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert!(Own::of(&unlabelled).is_err());
    }
}
