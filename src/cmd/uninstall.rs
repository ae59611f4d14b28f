//! `koord-webhook uninstall`: removes what the install made, in an order that leaves the cluster
//! working. The replicas stop first (so none of them recreates a webhook configuration while it is
//! being removed), then the webhook configurations go (so no entry points at a Service that no
//! longer answers), then everything else. Koordinator's CRDs, and so every ElasticQuota, Reservation
//! and ClusterColocationProfile, stay unless `--delete-crds`; the namespace stays unless
//! `--delete-namespace` (other Koordinator components may live in it).

use std::fmt::Debug;
use std::time::Duration;

use kube::Client;

use crate::install::CRITICAL_PODS_QUOTA;
use anyhow::Context;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams};
use serde::de::DeserializeOwned;

use crate::apis::all_crds;
use crate::names::{APP_NAME, Mode, selector};
use crate::names::{CA_ADOPTION_RECORD, LEASE, QUOTA_LEDGER, SECRET_CA, SECRET_TLS};

#[derive(Debug, Clone)]
pub struct Options {
    pub cluster: crate::cluster_client::ClusterFlags,
    pub delete_crds: bool,
    pub delete_namespace: bool,
    /// Hand the configurations and the Service back to koord-manager's webhook.
    pub keep_webhook_configurations: bool,
    /// How long to wait for the replicas to stop.
    pub timeout: Duration,
}

/// Deletes `name` (already gone is fine) and says so on stdout.
async fn delete<K>(api: &Api<K>, name: &str) -> anyhow::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let kind = K::kind(&());
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => println!("deleted {kind} {name}"),
        Err(kube::Error::Api(e)) if e.code == 404 => println!("{kind} {name} was not there"),
        Err(e) => return Err(e).with_context(|| format!("cannot delete {kind} {name}")),
    }
    Ok(())
}

/// The webhook configurations, then the Service they call.
async fn delete_admission(
    client: &kube::Client,
    namespace: &str,
    mode: Mode,
) -> anyhow::Result<()> {
    if let Some(name) = mode.mutating_configuration() {
        delete(
            &Api::<MutatingWebhookConfiguration>::all(client.clone()),
            name,
        )
        .await?;
    }
    delete(
        &Api::<ValidatingWebhookConfiguration>::all(client.clone()),
        mode.validating_configuration(),
    )
    .await?;
    delete(
        &Api::<Service>::namespaced(client.clone(), namespace),
        mode.service_name(),
    )
    .await
}

pub async fn run(options: &Options) -> anyhow::Result<()> {
    let mode = options.cluster.mode;
    if mode == Mode::Shadow && (options.delete_crds || options.keep_webhook_configurations) {
        anyhow::bail!(
            "a shadow owns neither Koordinator's CRDs nor its webhook configurations: \
             --delete-crds and --keep-webhook-configurations do not go with --mode shadow"
        );
    }
    let client = crate::cluster_client::client(&options.cluster).await?;
    let namespace = options.cluster.namespace();

    // 1. The replicas, and wait until none runs.
    stop_replicas(&client, namespace, options.timeout).await?;

    // 2. The webhook configurations: from now on the API server calls no webhook of ours. Kept
    // (with the Service) when koord-manager's webhook serves them again.
    if options.keep_webhook_configurations {
        println!(
            "kept the webhook configurations and Service {} (for koord-manager's webhook)",
            mode.service_name()
        );
    } else {
        delete_admission(&client, namespace, mode).await?;
    }

    // 3. The rest of the install, and what the operator made.
    delete_the_rest(&client, namespace, mode).await?;

    // 4. What the user keeps unless asked.
    if options.delete_crds {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in all_crds() {
            delete(&crds, crd.metadata.name.as_deref().unwrap_or_default()).await?;
        }
    } else if mode == Mode::Enforce {
        println!("kept the CRDs and their objects (--delete-crds removes them)");
    }
    if options.delete_namespace {
        delete(&Api::<Namespace>::all(client.clone()), namespace).await?;
    } else {
        println!("kept namespace {namespace} (--delete-namespace removes it)");
    }
    Ok(())
}

/// Deletes the Deployment and waits until none of its Pods runs (at most `timeout`: then the
/// webhook configurations are left in place, since a replica may still be answering).
async fn stop_replicas(client: &Client, namespace: &str, timeout: Duration) -> anyhow::Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    delete(&deployments, APP_NAME).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let by_app = ListParams::default().labels(&selector());
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = pods
            .list(&by_app)
            .await
            .context("cannot list the replicas")?;
        if left.items.is_empty() {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!(
                "{} replica(s) still running after {:?}; the webhook configurations were left in place \
                 (run uninstall again once they have stopped)",
                left.items.len(),
                timeout
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("no replica is running");
    Ok(())
}

/// The install's other objects, and what the operator made (Secrets, Lease, the quota ledger and
/// the record of a CA taken over: a new installation may take koord-manager's CA over again).
async fn delete_the_rest(client: &Client, namespace: &str, mode: Mode) -> anyhow::Result<()> {
    delete(
        &Api::<PodDisruptionBudget>::namespaced(client.clone(), namespace),
        APP_NAME,
    )
    .await?;
    delete(
        &Api::<ResourceQuota>::namespaced(client.clone(), namespace),
        CRITICAL_PODS_QUOTA,
    )
    .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    delete(&secrets, SECRET_TLS).await?;
    delete(&secrets, SECRET_CA).await?;
    delete(&Api::<Lease>::namespaced(client.clone(), namespace), LEASE).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    delete(&config_maps, QUOTA_LEDGER).await?;
    delete(&config_maps, CA_ADOPTION_RECORD).await?;
    delete(
        &Api::<RoleBinding>::namespaced(client.clone(), namespace),
        APP_NAME,
    )
    .await?;
    delete(
        &Api::<Role>::namespaced(client.clone(), namespace),
        APP_NAME,
    )
    .await?;
    if mode == Mode::Shadow {
        // Its reads of Koordinator's ConfigMaps, in their namespace.
        let there = mode.config_namespace();
        let name = mode.cluster_scoped_name();
        delete(&Api::<RoleBinding>::namespaced(client.clone(), there), name).await?;
        delete(&Api::<Role>::namespaced(client.clone(), there), name).await?;
    }
    let cluster_scoped = mode.cluster_scoped_name();
    delete(
        &Api::<ClusterRoleBinding>::all(client.clone()),
        cluster_scoped,
    )
    .await?;
    delete(&Api::<ClusterRole>::all(client.clone()), cluster_scoped).await?;
    delete(
        &Api::<ServiceAccount>::namespaced(client.clone(), namespace),
        APP_NAME,
    )
    .await
}
