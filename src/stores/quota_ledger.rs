//! The ElasticQuota ledger's record in the cluster: one ConfigMap in the operator's namespace whose
//! `last-change` key names the last admitted change. Writes carry the resourceVersion read, so of
//! two replicas writing after the same read only one succeeds.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

use crate::admission::ports::StoreError;
use crate::admission::ports::{LedgerRecord, LedgerStore, PendingChange};
use crate::names::QUOTA_LEDGER;
use crate::names::{NAMESPACE, app_labels};

const KEY: &str = "last-change";
const FIELD_MANAGER: &str = "koord-webhook";

pub struct KubeLedgerStore {
    pub client: Client,
}

fn store_error(e: kube::Error) -> StoreError {
    match e {
        kube::Error::Api(s) if s.code == 409 => StoreError::Conflict,
        other => StoreError::Other(other.to_string()),
    }
}

impl KubeLedgerStore {
    fn api(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// Creates the empty record by server-side apply (which RBAC can limit to this name).
    async fn create_empty(&self) -> Result<(), StoreError> {
        self.api()
            .patch(
                QUOTA_LEDGER,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&record(None, None)),
            )
            .await
            .map(|_| ())
            .map_err(store_error)
    }
}

/// The ledger ConfigMap: at `version` when given (a conditional write), holding `change` if any.
fn record(version: Option<&str>, change: Option<String>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(QUOTA_LEDGER.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            labels: Some(app_labels()),
            resource_version: version.map(str::to_owned),
            ..Default::default()
        },
        data: change.map(|text| BTreeMap::from([(KEY.to_owned(), text)])),
        ..Default::default()
    }
}

impl LedgerStore for KubeLedgerStore {
    fn read(&self) -> BoxFuture<'_, Result<LedgerRecord, StoreError>> {
        Box::pin(async move {
            let config_map = match self
                .api()
                .get_opt(QUOTA_LEDGER)
                .await
                .map_err(store_error)?
            {
                Some(c) => c,
                None => {
                    self.create_empty().await?;
                    self.api().get(QUOTA_LEDGER).await.map_err(store_error)?
                }
            };
            let last = config_map
                .data
                .as_ref()
                .and_then(|d| d.get(KEY))
                .and_then(|text| serde_json::from_str::<PendingChange>(text).ok());
            Ok(LedgerRecord {
                version: config_map.metadata.resource_version.unwrap_or_default(),
                last,
            })
        })
    }

    fn write<'a>(
        &'a self,
        version: &'a str,
        change: &'a PendingChange,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let text =
                serde_json::to_string(change).map_err(|e| StoreError::Other(e.to_string()))?;
            let config_map = record(Some(version), Some(text));
            self.api()
                .replace(QUOTA_LEDGER, &PostParams::default(), &config_map)
                .await
                .map(|_| ())
                .map_err(store_error)
        })
    }
}
