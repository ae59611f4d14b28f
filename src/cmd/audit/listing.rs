//! The stored objects of one kind, page by page, as the JSON the API server stores (each item with
//! its `apiVersion` and `kind`, which list items leave out): a page at a time is all `audit` holds.

use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Error};
use serde_json::Value;

/// A kind `audit` lists.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub plural: &'static str,
}

impl Kind {
    pub const fn new(
        group: &'static str,
        version: &'static str,
        kind: &'static str,
        plural: &'static str,
    ) -> Self {
        Self {
            group,
            version,
            kind,
            plural,
        }
    }

    fn resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(self.group, self.version, self.kind),
            self.plural,
        )
    }

    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// What to list: every object of a kind, or the objects of one namespace with one name.
pub enum Selection<'a> {
    All,
    Named { namespace: &'a str, name: &'a str },
}

/// The pages of one list, fetched one at a time.
pub struct Pages {
    api: Api<DynamicObject>,
    params: ListParams,
    api_version: String,
    kind: &'static str,
    finished: bool,
    /// False once the API server said it does not serve the kind (its CRD is not installed).
    pub served: bool,
}

impl Pages {
    pub fn new(client: &Client, kind: Kind, selection: Selection<'_>, page: u32) -> Self {
        let resource = kind.resource();
        let (api, params) = match selection {
            Selection::All => (
                Api::<DynamicObject>::all_with(client.clone(), &resource),
                ListParams::default(),
            ),
            Selection::Named { namespace, name } => (
                Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource),
                ListParams::default().fields(&format!("metadata.name={name}")),
            ),
        };
        Self {
            api,
            params: params.limit(page),
            api_version: kind.api_version(),
            kind: kind.kind,
            finished: false,
            served: true,
        }
    }

    /// The next page; `None` after the last (or when the kind is not served).
    pub async fn next(&mut self) -> Result<Option<Vec<Value>>, Error> {
        if self.finished {
            return Ok(None);
        }
        let list = match self.api.list(&self.params).await {
            Ok(list) => list,
            Err(Error::Api(status)) if status.code == 404 => {
                (self.finished, self.served) = (true, false);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        match list.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => self.params = self.params.clone().continue_token(&token),
            None => self.finished = true,
        }
        Ok(Some(
            list.items
                .into_iter()
                .filter_map(|object| {
                    let mut value = serde_json::to_value(object).ok()?;
                    value["apiVersion"] = Value::from(self.api_version.as_str());
                    value["kind"] = Value::from(self.kind);
                    Some(value)
                })
                .collect(),
        ))
    }
}
