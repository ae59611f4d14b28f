//! The ElasticQuota ledger's record in the cluster: one ConfigMap in the operator's namespace whose
//! `last-change` key names the last admitted change. Writes carry the resourceVersion read, so of
//! two replicas writing after the same read only one succeeds.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};

use super::store_error;
use crate::admission::ports::StoreError;
use crate::admission::ports::{LedgerRecord, LedgerStore, PendingChange};
use crate::names::{FIELD_MANAGER, QUOTA_LEDGER};
use crate::names::{app_labels, namespace};

const KEY: &str = "last-change";

pub struct KubeLedgerStore {
    pub client: Client,
}

impl KubeLedgerStore {
    fn api(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), namespace())
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
            namespace: Some(namespace().to_owned()),
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
                .replace(QUOTA_LEDGER, &crate::names::post_params(), &config_map)
                .await
                .map(|_| ())
                .map_err(store_error)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::ports::ChangeKind;
    use crate::controller::scripted_api::{self, Step, status};
    use hyper::http::{Method, StatusCode};
    use serde_json::json;

    const PATH: &str =
        "/api/v1/namespaces/koordinator-system/configmaps/koord-webhook-quota-ledger";

    fn change() -> PendingChange {
        PendingChange {
            id: "uid-1".into(),
            namespace: "ns".into(),
            name: "q".into(),
            operation: ChangeKind::Create,
            resource_version: None,
        }
    }

    fn stored(version: &str, last: Option<&PendingChange>) -> serde_json::Value {
        let mut config_map = serde_json::to_value(record(
            Some(version),
            last.map(|c| serde_json::to_string(c).unwrap()),
        ))
        .unwrap();
        config_map["apiVersion"] = json!("v1");
        config_map["kind"] = json!("ConfigMap");
        config_map
    }

    #[tokio::test]
    async fn a_missing_record_is_created_by_apply_then_read() {
        let (client, server) = scripted_api::client(vec![
            Step::not_found(Method::GET, PATH),
            Step::new(Method::PATCH, PATH, StatusCode::CREATED, stored("1", None)),
            Step::new(Method::GET, PATH, StatusCode::OK, stored("1", None)),
        ]);
        let record = KubeLedgerStore { client }.read().await.unwrap();
        assert_eq!(record.version, "1");
        assert_eq!(record.last, None);
        let seen = server.await.unwrap();
        assert_eq!(seen[1].content_type, "application/apply-patch+yaml");
        assert!(
            seen[1]
                .path_and_query
                .contains("fieldManager=koord-webhook")
        );
    }

    #[tokio::test]
    async fn a_write_names_the_version_read_and_a_409_is_a_conflict() {
        let (client, server) = scripted_api::client(vec![
            Step::new(
                Method::PUT,
                PATH,
                StatusCode::OK,
                stored("2", Some(&change())),
            ),
            Step::new(
                Method::PUT,
                PATH,
                StatusCode::CONFLICT,
                status(409, "Conflict"),
            ),
        ]);
        let store = KubeLedgerStore { client };
        store.write("1", &change()).await.unwrap();
        assert_eq!(store.write("1", &change()).await, Err(StoreError::Conflict));
        drop(store);
        let seen = server.await.unwrap();
        assert_eq!(seen[0].body["metadata"]["resourceVersion"], "1");
        let written: PendingChange =
            serde_json::from_str(seen[0].body["data"][KEY].as_str().unwrap()).unwrap();
        assert_eq!(written, change());
    }
}
