//! `koord-webhook audit`: what is already stored that the rules would refuse today — after years
//! of a webhook under `failurePolicy: Ignore`, or objects made while no webhook ran.
//!
//! Client-side, like `status`: it lists the kinds the cache holds (pages, one at a time) into the
//! cache `review` uses, then lists the kinds with validating rules again and runs each object
//! through its endpoint with every rule in Audit, so one object shows every rule it breaks. It only
//! reads: the chains run without write ports and on dry-run reviews. Exit 0 when nothing is found,
//! 1 when something is, 2 when the cluster cannot be read.

mod listing;
mod report;

use std::io::{IsTerminal, Write as _};

use anyhow::Context;
use kube::Client;
use serde_json::{Value, json};

use super::resolved::{OwnUserUnless, Rules};
use crate::admission::actions::RuleActions;
use crate::admission::{Admission, Settings, registered_rules};
use crate::cache::CacheWriter;
use crate::cache::load::to_cached;
use crate::cli::{AuditArgs, OutputFormat};
use crate::entries::{VALIDATE_CONFIGMAP, VALIDATE_ELASTIC_QUOTA, VALIDATE_NODE, VALIDATE_POD};
use crate::features::FeatureGates;
use crate::metrics::Metrics;
use listing::{Kind, Pages, Selection};
pub use report::Report;

const POD: Kind = Kind::new("", "v1", "Pod", "pods");
const NODE: Kind = Kind::new("", "v1", "Node", "nodes");
const NAMESPACE: Kind = Kind::new("", "v1", "Namespace", "namespaces");
const CONFIG_MAP: Kind = Kind::new("", "v1", "ConfigMap", "configmaps");
const PRIORITY_CLASS: Kind = Kind::new(
    "scheduling.k8s.io",
    "v1",
    "PriorityClass",
    "priorityclasses",
);
const ELASTIC_QUOTA: Kind = Kind::new(
    "scheduling.sigs.k8s.io",
    "v1alpha1",
    "ElasticQuota",
    "elasticquotas",
);
const ELASTIC_QUOTA_PROFILE: Kind = Kind::new(
    "quota.koordinator.sh",
    "v1alpha1",
    "ElasticQuotaProfile",
    "elasticquotaprofiles",
);
const RESERVATION: Kind = Kind::new(
    "scheduling.koordinator.sh",
    "v1alpha1",
    "Reservation",
    "reservations",
);
const COLOCATION_PROFILE: Kind = Kind::new(
    "config.koordinator.sh",
    "v1alpha1",
    "ClusterColocationProfile",
    "clustercolocationprofiles",
);

/// The kinds the cache holds (ConfigMaps apart: only the named ones the rules read).
const CACHED: [Kind; 8] = [
    NAMESPACE,
    PRIORITY_CLASS,
    COLOCATION_PROFILE,
    ELASTIC_QUOTA_PROFILE,
    ELASTIC_QUOTA,
    RESERVATION,
    NODE,
    POD,
];

/// A rule left out: quota evaluation charges a new pod to its quota's `child-request`, which
/// already counts a stored pod, so every stored pod of a full quota would be reported.
const NOT_FOR_STORED: &str = "ElasticQuotaEvaluation";

/// The user the audit's reviews name.
const AUDIT_USER: &str = "koord-webhook-audit";

/// The report and whether it found nothing.
pub async fn run(args: &AuditArgs) -> anyhow::Result<(String, bool)> {
    let client = crate::cluster_client::client(&args.cluster).await?;
    // A stored quota's recent-admissions record was written by the replicas: reviewed here as
    // this tool's change, it must count as theirs.
    let own = OwnUserUnless::Always(AUDIT_USER);
    let Rules { gates, settings } = if args.same_as_deployed {
        let deployed = super::deployed::flags(&client, args.cluster.namespace()).await?;
        deployed.with_own_user(own)
    } else {
        Rules::resolve(&args.feature_gates, &args.rules, own)?
    };
    let report = audit(&client, gates, settings, args).await?;
    let clean = report.objects_found == 0;
    let text = match args.output {
        OutputFormat::Json => serde_json::to_string_pretty(&report)? + "\n",
        OutputFormat::Yaml => serde_yaml::to_string(&report)?,
        OutputFormat::Text => report.render_text(),
    };
    Ok((text, clean))
}

async fn audit(
    client: &Client,
    gates: FeatureGates,
    settings: Settings,
    args: &AuditArgs,
) -> anyhow::Result<Report> {
    let mut report = Report::new(args.examples);
    let mut progress = Progress::new();
    let mut writer = CacheWriter::default();
    for kind in CACHED {
        let mut pages = Pages::new(client, kind, Selection::All, args.page_size);
        let mut listed = 0;
        while let Some(items) = next(&mut pages, kind).await? {
            listed += items.len();
            // What the cache cannot read, the watches set aside too: the rules never see it.
            items
                .into_iter()
                .filter_map(|item| to_cached(item).ok())
                .for_each(|object| writer.apply(object));
            progress.show(&format!("listing {}: {listed}", kind.plural));
        }
        if !pages.served {
            report.skip(format!("{} (not served by this cluster)", kind.plural));
        }
    }
    let mut config_maps = Vec::new();
    for (namespace, name) in settings.config_maps() {
        let selection = Selection::Named {
            namespace: &namespace,
            name: &name,
        };
        let mut pages = Pages::new(client, CONFIG_MAP, selection, args.page_size);
        while let Some(items) = next(&mut pages, CONFIG_MAP).await? {
            config_maps.extend(items);
        }
    }
    config_maps
        .iter()
        .filter_map(|item| to_cached(item.clone()).ok())
        .for_each(|object| writer.apply(object));
    writer.mark_ready();

    let settings = Settings {
        actions: RuleActions::auditing(&registered_rules()),
        ..settings
    };
    let admission = Admission::new(writer.reader(), gates, Metrics::new()).with_settings(settings);
    let mut checker = Checker {
        admission: &admission,
        report: &mut report,
    };
    for (kind, path) in [
        (POD, VALIDATE_POD),
        (NODE, VALIDATE_NODE),
        (ELASTIC_QUOTA, VALIDATE_ELASTIC_QUOTA),
    ] {
        if checker.admission.endpoint(path).is_none() {
            checker
                .report
                .skip(format!("{} ({path} is off)", kind.plural));
            continue;
        }
        let mut pages = Pages::new(client, kind, Selection::All, args.page_size);
        let mut checked = 0;
        while let Some(items) = next(&mut pages, kind).await? {
            for item in items {
                checker.check(kind, path, item).await;
                checked += 1;
            }
            progress.show(&format!("checking {}: {checked}", kind.plural));
        }
    }
    if checker.admission.endpoint(VALIDATE_CONFIGMAP).is_some() {
        for item in config_maps {
            checker.check(CONFIG_MAP, VALIDATE_CONFIGMAP, item).await;
        }
    }
    progress.done();
    Ok(report)
}

async fn next(pages: &mut Pages, kind: Kind) -> anyhow::Result<Option<Vec<Value>>> {
    pages
        .next()
        .await
        .with_context(|| format!("cannot list {}", kind.plural))
}

struct Checker<'a> {
    admission: &'a Admission,
    report: &'a mut Report,
}

impl Checker<'_> {
    /// Runs one stored object through `path` and records what its rules would refuse.
    async fn check(&mut self, kind: Kind, path: &str, object: Value) {
        let example = report::Example {
            kind: kind.kind,
            namespace: object["metadata"]["namespace"].as_str().map(str::to_owned),
            name: object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            message: String::new(),
        };
        let body = stored_review(kind, object);
        self.report.checked(kind.kind);
        let refusals = match self.admission.review(path, &body, None).await {
            Ok(answer) => refusals(&answer),
            Err(e) => vec![("(unanswered)".to_owned(), e.to_string())],
        };
        self.report.found(example, refusals);
    }
}

/// The review that asks whether a stored object would be admitted today: a dry-run CREATE, except
/// for an ElasticQuota, whose tree rules would count a created quota beside its stored self: an
/// UPDATE from an empty spec, so every tree rule weighs it against its stored parent and siblings.
fn stored_review(kind: Kind, object: Value) -> Vec<u8> {
    let (operation, old) = if kind.kind == ELASTIC_QUOTA.kind {
        let mut old = object.clone();
        old["spec"] = json!({});
        ("UPDATE", old)
    } else {
        ("CREATE", Value::Null)
    };
    let namespace = object["metadata"]["namespace"].clone();
    let name = object["metadata"]["name"].clone();
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "koord-webhook-audit",
            "kind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
            "resource": {"group": kind.group, "version": kind.version, "resource": kind.plural},
            "namespace": namespace, "name": name, "operation": operation,
            "userInfo": {"username": AUDIT_USER}, "dryRun": true,
            "object": object, "oldObject": old
        }
    });
    serde_json::to_vec(&review).unwrap_or_default()
}

/// The rules an answer says would refuse, as `(rule, message)`.
fn refusals(answer: &[u8]) -> Vec<(String, String)> {
    let Ok(review) = serde_json::from_slice::<Value>(answer) else {
        return vec![(
            "(unanswered)".to_owned(),
            "the answer does not decode".to_owned(),
        )];
    };
    let response = &review["response"];
    let mut found: Vec<(String, String)> = response["auditAnnotations"]["would-deny"]
        .as_str()
        .and_then(|list| serde_json::from_str::<Vec<Value>>(list).ok())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| {
            Some((
                f["rule"].as_str()?.to_owned(),
                f["message"].as_str()?.to_owned(),
            ))
        })
        .filter(|(rule, _)| rule != NOT_FOR_STORED)
        .collect();
    if response["allowed"] == false {
        let message = response["status"]["message"].as_str().unwrap_or_default();
        found.push(("(undecodable)".to_owned(), message.to_owned()));
    }
    found
}

/// One line of progress on a terminal (stderr), rewritten in place; nothing in a pipe.
struct Progress {
    on: bool,
}

impl Progress {
    fn new() -> Self {
        Self {
            on: std::io::stderr().is_terminal(),
        }
    }

    fn show(&mut self, line: &str) {
        if self.on {
            let _ = write!(std::io::stderr(), "\r\x1b[K{line}");
        }
    }

    fn done(&mut self) {
        if self.on {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}
