//! The admission endpoints and the webhook configuration entries that route to them
//! (docs/admission.md), and for each entry which requests its rules can act on (`narrowing/`,
//! docs/narrowing.md). The server, `review`, the manifests and the operator all read this table;
//! it is data about admission, not admission itself (`admission/` turns a request body into a
//! response body), so it sits below both.

pub mod narrowing;

use crate::apis::keys::QOS_CLASS_LABEL;
use crate::features::Gate;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WebhookKind {
    Mutating,
    Validating,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    Fail,
    Ignore,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        }
    }
}

/// Declares [`EndpointName`] and its complete list [`EndpointName::ALL`] from one list of variants, so
/// that the list cannot miss one.
macro_rules! endpoints {
    ($($(#[$doc:meta])* $variant:ident),* $(,)?) => {
        /// Every admission endpoint koord-webhook serves. Adding one is a variant here; the
        /// compiler then asks for the rest: its row of [`ENDPOINTS`] (checked in order below) and
        /// its chain (`admission::registry::build_endpoint`, an exhaustive match). docs/recipes.md.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum EndpointName {
            $($(#[$doc])* $variant),*
        }

        impl EndpointName {
            pub const ALL: &'static [EndpointName] = &[$(EndpointName::$variant),*];
        }
    };
}

endpoints!(
    MutatePod,
    ValidatePod,
    MutateElasticQuota,
    ValidateElasticQuota,
    MutateNodeStatus,
    ValidateNode,
    MutateReservation,
    ValidateConfigMap,
    ValidateColocationProfile,
);

/// One admission path served by koord-webhook.
#[derive(Debug)]
pub struct EndpointSpec {
    pub endpoint: EndpointName,
    pub path: &'static str,
    pub gate: Gate,
    pub kind: WebhookKind,
    /// Requests for other resources or subresources are allowed untouched.
    pub resource: &'static str,
    pub sub_resource: &'static str,
    pub failure_policy: FailurePolicy,
    pub entries: &'static [EntrySpec],
}

/// How an entry of the webhook table is narrowed when `--narrow-calls=on`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Narrowing {
    /// Every request the rules select is sent (what the entry's rules read is not in the request
    /// alone, or every request can change the answer).
    Wide,
    /// No request can change the answer: the entry is not registered.
    Never,
    /// `nodes/status` updates of nodes with amplification annotations.
    NodeStatus,
    /// Node creates and updates the node rules can deny.
    NodeValidation,
    /// ElasticQuota changes the tree rules read.
    ElasticQuotaChange,
    /// Pod creates carrying Koordinator's marks, or selected by a ClusterColocationProfile.
    PodCreate,
    /// Pod changes carrying Koordinator's marks, or in a namespace of a parent quota.
    PodValidation,
    /// Registered only while calls are narrowed: the changes that may widen a pod entry, admitted
    /// once the entry is wide enough (`ClusterColocationProfile` creates and updates).
    PodReachGuard,
}

/// One entry of a webhook configuration.
#[derive(Debug)]
pub struct EntrySpec {
    pub name: &'static str,
    pub operations: &'static [&'static str],
    pub api_group: &'static str,
    pub api_version: &'static str,
    /// As in a rule's `resources`, e.g. `pods` or `nodes/status`.
    pub resource: &'static str,
    /// Skip the operator's own namespace and kube-system.
    pub exclude_system_namespaces: bool,
    pub object_selector: Option<(&'static str, &'static str)>,
    pub side_effects: &'static str,
    /// Which requests the entry needs when calls are narrowed (`--narrow-calls`).
    pub narrowing: Narrowing,
    /// Registered as two webhooks split by a label: see [`LabelledPart`].
    pub labelled_part: Option<LabelledPart>,
}

/// With `serve --qos-split=on`, the requests whose object carries `label` go to a second webhook
/// of the entry, `name`, which has the entry's settings but no matchConditions; the entry itself
/// gets the rest (its objectSelector says the label does not exist). Only for a label every
/// condition of the entry sends anyway (a test checks it), so the two together are sent what the
/// entry alone would be.
///
/// Why: the API server decides an objectSelector from the labels, before it converts the object
/// for CEL, which is most of what a condition costs (docs/narrowing.md). Split on Koordinator's
/// QoS label, a pod carrying it is not converted for `vpod`, nor for `mpod-create` when the API
/// server matches the mutating entries again after a patch changed the pod (it evaluates every
/// entry's conditions before it looks at whether the entry is to be reinvoked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LabelledPart {
    pub name: &'static str,
    pub label: &'static str,
}

const fn entry(
    name: &'static str,
    operations: &'static [&'static str],
    api_group: &'static str,
    api_version: &'static str,
    resource: &'static str,
) -> EntrySpec {
    EntrySpec {
        name,
        operations,
        api_group,
        api_version,
        resource,
        exclude_system_namespaces: false,
        object_selector: None,
        side_effects: "None",
        narrowing: Narrowing::Wide,
        labelled_part: None,
    }
}

pub const MUTATE_POD: &str = "/mutate-pod";
pub const VALIDATE_POD: &str = "/validate-pod";
pub const MUTATE_ELASTIC_QUOTA: &str = "/mutate-scheduling-sigs-k8s-io-v1alpha1-elasticquota";
pub const VALIDATE_ELASTIC_QUOTA: &str = "/validate-scheduling-sigs-k8s-io-v1alpha1-elasticquota";
pub const MUTATE_NODE_STATUS: &str = "/mutate-node-status";
pub const VALIDATE_NODE: &str = "/validate-node";
pub const MUTATE_RESERVATION: &str = "/mutate-reservation";
pub const VALIDATE_CONFIGMAP: &str = "/validate-configmap";
pub const VALIDATE_COLOCATION_PROFILE: &str = "/validate-clustercolocationprofile";

/// The table: one row per [`EndpointName`], in the order of [`EndpointName::ALL`].
pub const ENDPOINTS: &[EndpointSpec] = &[
    EndpointSpec {
        endpoint: EndpointName::MutatePod,
        path: MUTATE_POD,
        gate: Gate::PodMutatingWebhook,
        kind: WebhookKind::Mutating,
        resource: "pods",
        sub_resource: "",
        failure_policy: FailurePolicy::Fail,
        entries: &[
            EntrySpec {
                exclude_system_namespaces: true,
                narrowing: Narrowing::PodCreate,
                labelled_part: Some(LabelledPart {
                    name: "mpod-create-qos.koordinator.sh",
                    label: QOS_CLASS_LABEL,
                }),
                ..entry("mpod-create.koordinator.sh", &["CREATE"], "", "v1", "pods")
            },
            EntrySpec {
                exclude_system_namespaces: true,
                object_selector: Some(("pod.koordinator.sh/mutating-update", "true")),
                // Every rule of /mutate-pod acts on CREATE only (docs/admission.md).
                narrowing: Narrowing::Never,
                ..entry("mpod-update.koordinator.sh", &["UPDATE"], "", "v1", "pods")
            },
        ],
    },
    EndpointSpec {
        endpoint: EndpointName::ValidatePod,
        path: VALIDATE_POD,
        gate: Gate::PodValidatingWebhook,
        kind: WebhookKind::Validating,
        resource: "pods",
        sub_resource: "",
        failure_policy: FailurePolicy::Fail,
        entries: &[EntrySpec {
            exclude_system_namespaces: true,
            side_effects: "NoneOnDryRun",
            narrowing: Narrowing::PodValidation,
            labelled_part: Some(LabelledPart {
                name: "vpod-qos.koordinator.sh",
                label: QOS_CLASS_LABEL,
            }),
            ..entry(
                "vpod.koordinator.sh",
                &["CREATE", "UPDATE"],
                "",
                "v1",
                "pods",
            )
        }],
    },
    EndpointSpec {
        endpoint: EndpointName::MutateElasticQuota,
        path: MUTATE_ELASTIC_QUOTA,
        gate: Gate::ElasticMutatingWebhook,
        kind: WebhookKind::Mutating,
        resource: "elasticquotas",
        sub_resource: "",
        failure_policy: FailurePolicy::Fail,
        entries: &[entry(
            "melasticquota.koordinator.sh",
            &["CREATE"],
            "scheduling.sigs.k8s.io",
            "v1alpha1",
            "elasticquotas",
        )],
    },
    EndpointSpec {
        endpoint: EndpointName::ValidateElasticQuota,
        path: VALIDATE_ELASTIC_QUOTA,
        gate: Gate::ElasticValidatingWebhook,
        kind: WebhookKind::Validating,
        resource: "elasticquotas",
        sub_resource: "",
        failure_policy: FailurePolicy::Fail,
        entries: &[EntrySpec {
            narrowing: Narrowing::ElasticQuotaChange,
            // Widening a pod entry is a write; a dry run makes none.
            side_effects: "NoneOnDryRun",
            ..entry(
                "velasticquota.koordinator.sh",
                &["CREATE", "UPDATE", "DELETE"],
                "scheduling.sigs.k8s.io",
                "v1alpha1",
                "elasticquotas",
            )
        }],
    },
    EndpointSpec {
        endpoint: EndpointName::MutateNodeStatus,
        path: MUTATE_NODE_STATUS,
        gate: Gate::NodeMutatingWebhook,
        kind: WebhookKind::Mutating,
        resource: "nodes",
        sub_resource: "status",
        failure_policy: FailurePolicy::Ignore,
        entries: &[EntrySpec {
            narrowing: Narrowing::NodeStatus,
            ..entry(
                "mnode-status.koordinator.sh",
                &["CREATE", "UPDATE"],
                "",
                "v1",
                "nodes/status",
            )
        }],
    },
    EndpointSpec {
        endpoint: EndpointName::ValidateNode,
        path: VALIDATE_NODE,
        gate: Gate::NodeValidatingWebhook,
        kind: WebhookKind::Validating,
        resource: "nodes",
        sub_resource: "",
        failure_policy: FailurePolicy::Ignore,
        entries: &[EntrySpec {
            narrowing: Narrowing::NodeValidation,
            ..entry(
                "vnode.koordinator.sh",
                &["CREATE", "UPDATE"],
                "",
                "v1",
                "nodes",
            )
        }],
    },
    EndpointSpec {
        endpoint: EndpointName::MutateReservation,
        path: MUTATE_RESERVATION,
        gate: Gate::ReservationMutatingWebhook,
        kind: WebhookKind::Mutating,
        resource: "reservations",
        sub_resource: "",
        failure_policy: FailurePolicy::Fail,
        entries: &[entry(
            "mreservation-create.koordinator.sh",
            &["CREATE"],
            "scheduling.koordinator.sh",
            "v1alpha1",
            "reservations",
        )],
    },
    EndpointSpec {
        endpoint: EndpointName::ValidateConfigMap,
        path: VALIDATE_CONFIGMAP,
        gate: Gate::ConfigMapValidatingWebhook,
        kind: WebhookKind::Validating,
        resource: "configmaps",
        sub_resource: "",
        failure_policy: FailurePolicy::Fail,
        entries: &[EntrySpec {
            object_selector: Some(("koordinator.sh/configmap-type", "slo-controller-config")),
            ..entry(
                "vconfigmap.koordinator.sh",
                &["CREATE", "UPDATE", "DELETE"],
                "",
                "v1",
                "configmaps",
            )
        }],
    },
    EndpointSpec {
        endpoint: EndpointName::ValidateColocationProfile,
        path: VALIDATE_COLOCATION_PROFILE,
        // It keeps mpod-create narrowed safely, so it lives and dies with /mutate-pod.
        gate: Gate::PodMutatingWebhook,
        kind: WebhookKind::Validating,
        resource: "clustercolocationprofiles",
        sub_resource: "",
        failure_policy: FailurePolicy::Fail,
        entries: &[EntrySpec {
            narrowing: Narrowing::PodReachGuard,
            side_effects: "NoneOnDryRun",
            ..entry(
                "vclustercolocationprofile.koordinator.sh",
                &["CREATE", "UPDATE"],
                "config.koordinator.sh",
                "v1alpha1",
                "clustercolocationprofiles",
            )
        }],
    },
];

// Every endpoint has its row, in order: a missing or extra row fails the build.
const _: () = {
    assert!(
        ENDPOINTS.len() == EndpointName::ALL.len(),
        "ENDPOINTS needs one row per EndpointName variant"
    );
    let mut i = 0;
    while i < ENDPOINTS.len() {
        assert!(
            ENDPOINTS[i].endpoint as usize == EndpointName::ALL[i] as usize,
            "ENDPOINTS' rows are in the order of EndpointName's variants"
        );
        i += 1;
    }
};

impl EndpointName {
    /// Its row of [`ENDPOINTS`] (the rows are in the variants' order, checked above).
    pub fn spec(self) -> &'static EndpointSpec {
        &ENDPOINTS[self as usize]
    }
}

pub fn find(path: &str) -> Option<&'static EndpointSpec> {
    ENDPOINTS.iter().find(|w| w.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every endpoint is fuzzed: a target under fuzz/fuzz_targets reviews bodies through it
    /// (`scripts/fuzz` runs every target in CI). A new endpoint fails here until it has one.
    #[test]
    fn every_endpoint_has_a_fuzz_target() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/fuzz_targets");
        let targets: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
            .collect();
        for endpoint in EndpointName::ALL {
            let call = format!("EndpointName::{endpoint:?},");
            assert!(
                targets.iter().any(|source| source.contains(&call)),
                "no fuzz target reviews through {endpoint:?} ({}): add one under {dir}",
                endpoint.spec().path
            );
        }
    }

    #[test]
    fn an_endpoint_name_finds_its_own_row() {
        for &endpoint in EndpointName::ALL {
            assert_eq!(endpoint.spec().endpoint, endpoint);
            assert_eq!(find(endpoint.spec().path).unwrap().endpoint, endpoint);
        }
    }
}
