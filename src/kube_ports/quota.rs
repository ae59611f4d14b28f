//! The quota evaluation write (docs/admission.md, /validate-pod) against the API server: read the quota, and
//! replace it carrying the resourceVersion read, so a concurrent writer makes it a conflict that the
//! evaluator retries.

use futures::future::BoxFuture;
use kube::Client;
use kube::api::Api;

use crate::admission::ports::{QuotaStore, StoreError};
use crate::apis::ElasticQuota;

pub struct KubeQuotaStore {
    pub client: Client,
}

fn store_error(e: kube::Error, name: &str) -> StoreError {
    match e {
        kube::Error::Api(s) if s.code == 404 => StoreError::NotFound(name.to_owned()),
        other => super::errors::store_error(other),
    }
}

impl QuotaStore for KubeQuotaStore {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<ElasticQuota, StoreError>> {
        Box::pin(async move {
            let api: Api<ElasticQuota> = Api::namespaced(self.client.clone(), namespace);
            api.get(name).await.map_err(|e| store_error(e, name))
        })
    }

    fn replace<'a>(
        &'a self,
        quota: &'a ElasticQuota,
    ) -> BoxFuture<'a, Result<ElasticQuota, StoreError>> {
        Box::pin(async move {
            let name = quota.metadata.name.clone().unwrap_or_default();
            let namespace = quota.metadata.namespace.clone().unwrap_or_default();
            let api: Api<ElasticQuota> = Api::namespaced(self.client.clone(), &namespace);
            api.replace(&name, &crate::names::post_params(), quota)
                .await
                .map_err(|e| store_error(e, &name))
        })
    }
}
