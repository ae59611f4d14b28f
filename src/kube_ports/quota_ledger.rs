//! The ElasticQuota ledger's record in the cluster: one ConfigMap in the operator's namespace, one
//! data key per ledger key (`t.<tree>`, `n.<namespace>`, and `last-change`, the key replicas before
//! keyed ledgers read), each naming the last admitted change, and [`PROVEN_KEY`], the callers
//! proven to be the API server (a JSON object: not a change, so replicas before it leave it out).
//! Writes carry the resourceVersion read, so of two replicas writing after the same read only one
//! succeeds.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};

use super::errors::store_error;
use crate::admission::ports::StoreError;
use crate::admission::ports::{LedgerRecord, LedgerStore, PendingChange, ProvenCallers};
use crate::names::{FIELD_MANAGER, QUOTA_LEDGER};
use crate::names::{app_labels, namespace};

/// The data key of the proven callers (no ledger key starts with `a`), an object of address to
/// when it was last proven.
const PROVEN_KEY: &str = "api-servers";
/// Where replicas before the probe kept theirs (a list, proven another way): not read.
const OLD_PROVEN_KEY: &str = "proven-callers";

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

/// The ledger ConfigMap: at `version` when given (a conditional write), holding `data` if any.
fn record(version: Option<&str>, data: Option<BTreeMap<String, String>>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(QUOTA_LEDGER.to_owned()),
            namespace: Some(namespace().to_owned()),
            labels: Some(app_labels()),
            resource_version: version.map(str::to_owned),
            ..Default::default()
        },
        data,
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
            let mut data = config_map.data.unwrap_or_default();
            data.remove(OLD_PROVEN_KEY);
            // Proof that does not parse is left out: replicas learn it again.
            let proven = data
                .remove(PROVEN_KEY)
                .and_then(|text| serde_json::from_str(&text).ok())
                .unwrap_or_default();
            // An entry that does not parse is left out: it names no change anyone waits for.
            let last = data
                .into_iter()
                .filter_map(|(key, text)| Some((key, serde_json::from_str(&text).ok()?)))
                .collect();
            Ok(LedgerRecord {
                version: config_map.metadata.resource_version.unwrap_or_default(),
                last,
                proven,
            })
        })
    }

    fn write<'a>(
        &'a self,
        version: &'a str,
        last: &'a BTreeMap<String, PendingChange>,
        proven: &'a ProvenCallers,
    ) -> BoxFuture<'a, Result<String, StoreError>> {
        Box::pin(async move {
            let mut data: BTreeMap<String, String> = last
                .iter()
                .map(|(key, change)| Ok((key.clone(), serde_json::to_string(change)?)))
                .collect::<Result<_, serde_json::Error>>()
                .map_err(|e| StoreError::Other(e.to_string()))?;
            if !proven.is_empty() {
                let text =
                    serde_json::to_string(proven).map_err(|e| StoreError::Other(e.to_string()))?;
                data.insert(PROVEN_KEY.to_owned(), text);
            }
            let config_map = record(Some(version), Some(data));
            self.api()
                .replace(QUOTA_LEDGER, &crate::names::post_params(), &config_map)
                .await
                .map(|written| written.metadata.resource_version.unwrap_or_default())
                .map_err(store_error)
        })
    }

    fn write_proven<'a>(
        &'a self,
        proven: &'a ProvenCallers,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let text =
                serde_json::to_string(proven).map_err(|e| StoreError::Other(e.to_string()))?;
            // A merge patch of the one key, naming no version: nothing else in the record moves.
            let patch = serde_json::json!({"data": {PROVEN_KEY: text}});
            self.api()
                .patch(
                    QUOTA_LEDGER,
                    &PatchParams {
                        field_manager: Some(FIELD_MANAGER.to_owned()),
                        ..Default::default()
                    },
                    &Patch::Merge(&patch),
                )
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
    use crate::scripted_api::{self, Step, status};
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
            at: 7,
            caller: None,
        }
    }

    fn entries() -> BTreeMap<String, PendingChange> {
        BTreeMap::from([("t.q".to_owned(), change())])
    }

    fn stored(version: &str, last: Option<&PendingChange>) -> serde_json::Value {
        let data = last.map(|c| {
            BTreeMap::from([
                ("t.q".to_owned(), serde_json::to_string(c).unwrap()),
                ("t.bad".to_owned(), "{not json".to_owned()),
                (
                    PROVEN_KEY.to_owned(),
                    r#"{"10.0.0.1":1700000000}"#.to_owned(),
                ),
                (OLD_PROVEN_KEY.to_owned(), r#"["10.66.0.1"]"#.to_owned()),
            ])
        });
        let mut config_map = serde_json::to_value(record(Some(version), data)).unwrap();
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
        assert!(record.last.is_empty());
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
            Step::new(
                Method::GET,
                PATH,
                StatusCode::OK,
                stored("2", Some(&change())),
            ),
        ]);
        let store = KubeLedgerStore { client };
        let proven = ProvenCallers::from([("10.0.0.1".to_owned(), 1_700_000_000)]);
        assert_eq!(store.write("1", &entries(), &proven).await.unwrap(), "2");
        assert_eq!(
            store.write("1", &entries(), &proven).await,
            Err(StoreError::Conflict)
        );
        // An entry that does not parse is left out; the proven callers are not an entry, and
        // those of replicas before the probe are not read.
        let read = store.read().await.unwrap();
        assert_eq!(read.last, entries());
        assert_eq!(read.proven, proven);
        drop(store);
        let seen = server.await.unwrap();
        assert_eq!(seen[0].body["metadata"]["resourceVersion"], "1");
        let written: PendingChange =
            serde_json::from_str(seen[0].body["data"]["t.q"].as_str().unwrap()).unwrap();
        assert_eq!(written, change());
        assert_eq!(
            seen[0].body["data"][PROVEN_KEY],
            r#"{"10.0.0.1":1700000000}"#
        );
    }
}
