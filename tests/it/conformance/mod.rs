//! The differential harness (conformance/README.md): seeded random reviews through Koordinator
//! v1.8.0's own webhook handlers (`koordinator/review`, built by `koordinator/build review`) and
//! through ours, side by side, comparing allowed, code, message and the patched object.
//!
//! A difference the documented decisions (docs/admission.md, "Deliberate differences") do not
//! explain fails the test with its seed, endpoint and both answers; `CONFORMANCE_SEED` and
//! `CONFORMANCE_CASES` replay or widen a run.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use base64::Engine;
use koord_webhook::admission::{Admission, Settings};
use koord_webhook::cache::CacheWriter;
use koord_webhook::cache::load::to_cached;
use koord_webhook::entries;
use koord_webhook::features::FeatureGates;
use koord_webhook::metrics::Metrics;
use serde_json::{Value, json};

mod generators;
mod idempotence;

use generators::{
    mutate_pod_case, mutate_reservation_case, node_status_case, pod_quota_case, quota_case,
    slo_config_case, validate_node_case, validate_pod_case,
};

/// SplitMix64: small, seedable, the same sequence everywhere.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub(super) fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub(super) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// One review and the cluster it meets.
#[derive(Debug, Clone)]
pub struct Case {
    pub path: &'static str,
    pub gates: BTreeMap<&'static str, bool>,
    pub objects: Vec<Value>,
    pub review: Value,
}

/// What one side answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub allowed: bool,
    pub code: i64,
    pub message: String,
    pub patched: Value,
}

/// What both sides may write differently and mean the same: Koordinator re-encodes the whole
/// object it patches, so its quantities come back canonical (`33000m` as `33`) and an absent
/// status as `{}`. Compared by value, and without an empty status.
fn normalized(mut object: Value) -> Value {
    if let Some(map) = object.as_object_mut()
        && map.get("status").is_some_and(|s| s == &json!({}))
    {
        map.remove("status");
    }
    // An emptied map is written as absent (Go's omitempty).
    if let Some(Value::Object(meta)) = object.get_mut("metadata") {
        meta.retain(|k, v| !(["labels", "annotations"].contains(&k.as_str()) && v == &json!({})));
    }
    // An empty resource list too.
    if let Some(Value::Object(spec)) = object.get_mut("spec") {
        spec.retain(|k, v| !(["min", "max"].contains(&k.as_str()) && v == &json!({})));
    }
    // Containers: an empty `resources` is none, quantities by value.
    for list in ["containers", "initContainers"] {
        if let Some(Value::Array(containers)) = object.pointer_mut(&format!("/spec/{list}")) {
            for c in containers.iter_mut().filter_map(Value::as_object_mut) {
                if c.get("resources") == Some(&json!({})) {
                    c.remove("resources");
                }
                for kind in ["requests", "limits"] {
                    if let Some(Value::Object(r)) =
                        c.get_mut("resources").and_then(|r| r.get_mut(kind))
                    {
                        canonical_quantities(r);
                    }
                }
            }
        }
    }
    for list in [
        "/spec/min",
        "/spec/max",
        "/status/allocatable",
        "/status/capacity",
    ] {
        if let Some(Value::Object(entries)) = object.pointer_mut(list) {
            canonical_quantities(entries);
        }
    }
    object
}

fn canonical_quantities(entries: &mut serde_json::Map<String, Value>) {
    for value in entries.values_mut() {
        if let Some(q) = value
            .as_str()
            .and_then(|t| t.parse::<koord_webhook::resources::Qty>().ok())
        {
            *value = json!(q.to_string());
        }
    }
}

/// Gates Koordinator v1.8.0 does not have (ours, or from later Koordinator versions), at the value
/// that behaves as v1.8.0 does; Koordinator's side is not told about them.
const OURS_ONLY: [(&str, bool); 5] = [
    ("AmplifyNodeCapacity", false),
    ("ReservationAffinityValidation", false),
    ("DisableExtendedResourceSpec", false),
    ("DisableDeviceResourceSpec", false),
    ("EnableQuotaAdmissionOnUpdate", false),
];

fn ours(case: &Case) -> Answer {
    let (response, patched) = ours_raw(case);
    Answer {
        allowed: response["allowed"].as_bool().unwrap_or(false),
        code: response["status"]["code"].as_i64().unwrap_or(0),
        message: response["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        patched: normalized(patched),
    }
}

/// Our response to the case's review, and the object with its patch applied (as sent when none).
fn ours_raw(case: &Case) -> (Value, Value) {
    let mut writer = CacheWriter::default();
    for object in &case.objects {
        writer.apply(to_cached(object.clone()).expect("state object"));
    }
    let gates: FeatureGates = case
        .gates
        .iter()
        .map(|(g, on)| (*g, *on))
        .chain(OURS_ONLY)
        .map(|(g, on)| format!("{g}={on}"))
        .collect::<Vec<_>>()
        .join(",")
        .parse()
        .unwrap();
    let admission =
        Admission::new(writer.reader(), gates, Metrics::new()).with_settings(Settings::default());
    let body = serde_json::to_vec(&case.review).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = runtime
        .block_on(admission.review(case.path, &body, None))
        .unwrap();
    let response: Value = serde_json::from_slice::<Value>(&out).unwrap()["response"].clone();
    let object = case.review["request"]["object"].clone();
    let patched = match response["patch"].as_str() {
        Some(patch) => {
            let patch = base64::engine::general_purpose::STANDARD
                .decode(patch)
                .unwrap();
            let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
            let mut doc = object;
            json_patch::patch(&mut doc, &patch).unwrap();
            doc
        }
        // No patch: the object as sent is what the API server keeps.
        None => object,
    };
    (response, patched)
}

/// One `koordinator-review --lines` process: cases in, one answer line each out. Started again
/// after it dies (a panic outside the handler, say), which that case reports.
struct Koordinator {
    harness: String,
    child: Option<(
        std::process::Child,
        std::io::BufReader<std::process::ChildStdout>,
    )>,
}

impl Koordinator {
    fn new(harness: &str) -> Self {
        Self {
            harness: harness.to_owned(),
            child: None,
        }
    }

    fn answer(&mut self, input: &Value) -> Result<String, String> {
        use std::io::BufRead;
        if self.child.is_none() {
            let mut child = Command::new(&self.harness)
                .arg("--lines")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| e.to_string())?;
            let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
            self.child = Some((child, stdout));
        }
        let (child, stdout) = self.child.as_mut().unwrap();
        let mut line = String::new();
        let sent = child
            .stdin
            .as_mut()
            .unwrap()
            .write_all(&serde_json::to_vec(input).unwrap());
        let read = sent.and_then(|()| stdout.read_line(&mut line));
        match read {
            Ok(n) if n > 0 => Ok(line),
            outcome => {
                let (mut child, _) = self.child.take().unwrap();
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("koordinator-review stopped: {outcome:?}"))
            }
        }
    }
}

impl Drop for Koordinator {
    fn drop(&mut self) {
        if let Some((mut child, _)) = self.child.take() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

fn theirs(koordinator: &mut Koordinator, case: &Case) -> Result<Answer, String> {
    let input = json!({"path": case.path, "gates": case.gates, "objects": case.objects, "review": case.review});
    let line = koordinator.answer(&input)?;
    let answer: Value = serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))?;
    if let Some(e) = answer["error"].as_str() {
        return Err(e.to_owned());
    }
    if let Some(panic) = answer["panic"].as_str() {
        // Served, the panic ends the connection: the API server reports the call failed, which
        // under the entry's `Fail` policy refuses the request.
        return Ok(Answer {
            allowed: false,
            code: 0,
            message: format!("{PANICKED}{panic}"),
            patched: Value::Null,
        });
    }
    Ok(Answer {
        allowed: answer["allowed"].as_bool().unwrap_or(false),
        code: answer["code"].as_i64().unwrap_or(0),
        message: answer["message"].as_str().unwrap_or_default().to_owned(),
        patched: normalized(match &answer["patched"] {
            Value::Null => case.review["request"]["object"].clone(),
            patched => patched.clone(),
        }),
    })
}

fn harness() -> String {
    let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/koordinator/build"))
        .arg("review")
        .output()
        .expect("koordinator/build");
    assert!(
        out.status.success(),
        "koordinator/build review failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Whether two answers agree, by the rules docs/admission.md ("Agreement with Koordinator")
/// gives: the code only when denied (an allowed answer's status is not read by the API server); a
/// message that reports a JSON parse failure up to the parser's own words, which are Go's there
/// and serde's here.
fn agree(ours: &Answer, theirs: &Answer) -> bool {
    ours.allowed == theirs.allowed
        && ours.patched == theirs.patched
        && (ours.allowed || ours.code == theirs.code)
        && same_message(&ours.message, &theirs.message)
}

/// Equal, or equal up to the JSON parser's words; an SLO config rejection
/// (`___{"reason":R,"message":M}___`) by its reason and its message read the same way.
fn same_message(ours: &str, theirs: &str) -> bool {
    let wrapped = |m: &str| {
        m.strip_prefix("___")
            .and_then(|m| m.strip_suffix("___"))
            .and_then(|m| serde_json::from_str::<Value>(m).ok())
    };
    if let (Some(a), Some(b)) = (wrapped(ours), wrapped(theirs)) {
        return a["reason"] == b["reason"]
            && match (a["message"].as_str(), b["message"].as_str()) {
                (Some(a), Some(b)) => same_message(a, b),
                _ => a["message"] == b["message"],
            };
    }
    ours == theirs
        || without_parser_words(ours).is_some_and(|h| Some(h) == without_parser_words(theirs))
}

/// A message with the JSON parser's own words cut off its end (Go's there, serde's here), or
/// `None` when it does not end with them.
fn without_parser_words(message: &str) -> Option<&str> {
    const GO: [&str; 3] = [
        "invalid character ",
        "unexpected end of JSON input",
        "json: cannot unmarshal ",
    ];
    const SERDE: [&str; 5] = [
        "expected ",
        "invalid type",
        "invalid value",
        "EOF while parsing",
        "trailing ",
    ];
    let serde_position = |tail: &str| {
        tail.rsplit_once(" at line ").is_some_and(|(_, at)| {
            at.split(" column ")
                .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
    };
    // Decoding from an already-read value (keys folded as Go folds them) gives serde's words
    // without a position.
    const SERDE_VALUE: [&str; 2] = ["invalid type: ", "invalid value: "];
    let parser = |tail: &str| {
        GO.iter().any(|g| tail.starts_with(g))
            || (SERDE.iter().any(|p| tail.starts_with(p)) && serde_position(tail))
            || SERDE_VALUE.iter().any(|p| tail.starts_with(p))
    };
    if parser(message) {
        return Some("");
    }
    message
        .match_indices(": ")
        .map(|(at, _)| at)
        .find(|&at| parser(&message[at + 2..]))
        .map(|at| &message[..at])
}

/// How a Koordinator answer that is a panic starts.
const PANICKED: &str = "Koordinator panicked: ";

/// A difference docs/admission.md ("Agreement with Koordinator") keeps on purpose.
fn deliberate(ours: &Answer, theirs: &Answer) -> bool {
    // Where Koordinator panics (a config key that is JSON `null`), the call fails and the
    // request is refused; ours refuses it with a message.
    if theirs.message.starts_with(PANICKED) {
        return !ours.allowed;
    }
    // The amplification ratios' bounds are ours alone (docs/admission.md, /validate-node).
    if !ours.allowed
        && theirs.allowed
        && ours
            .message
            .starts_with("node.koordinator.sh/resource-amplification-ratio: ")
    {
        return true;
    }
    // Stored quotas that already bind one namespace twice (written around the webhook): Koordinator
    // names whichever its informer saw last, ours the first by name.
    let bound = |m: &str| {
        m.rsplit_once("is already bound to quota ")
            .map(|(head, _)| head.to_owned())
    };
    if !ours.allowed && !theirs.allowed && bound(&ours.message).is_some() {
        return bound(&ours.message) == bound(&theirs.message);
    }
    // A quota may not be its own parent or its descendant's child: Koordinator lets such an
    // update through and its tree then loops.
    !ours.allowed && theirs.allowed && ours.message.ends_with("would make the quota tree a cycle")
}

/// What one endpoint's run found.
#[derive(Debug, Default)]
pub struct EndpointReport {
    pub endpoint: &'static str,
    pub cases: usize,
    pub identical: usize,
    /// Differences docs/admission.md keeps on purpose.
    pub documented: usize,
    /// Every other difference, with its seed and both answers.
    pub unexplained: Vec<String>,
}

type Generator = fn(&mut Rng) -> Case;

fn mutate_quota(r: &mut Rng) -> Case {
    quota_case(r, entries::MUTATE_ELASTIC_QUOTA)
}

fn validate_quota(r: &mut Rng) -> Case {
    quota_case(r, entries::VALIDATE_ELASTIC_QUOTA)
}

/// The case again, with the object as our first answer left it: what the endpoint meets when it
/// sees an object it (or koord-manager, which agrees) already mutated.
fn again(generate: Generator, r: &mut Rng) -> Case {
    let case = generate(r);
    let (_, patched) = ours_raw(&case);
    with_object(case, patched)
}

/// The case with `object` in place of its review's object.
fn with_object(mut case: Case, object: Value) -> Case {
    case.review["request"]["object"] = object;
    case
}

fn mutate_quota_again(r: &mut Rng) -> Case {
    again(mutate_quota, r)
}

fn node_status_again(r: &mut Rng) -> Case {
    again(node_status_case, r)
}

fn mutate_pod_again(r: &mut Rng) -> Case {
    again(mutate_pod_case, r)
}

fn mutate_reservation_again(r: &mut Rng) -> Case {
    again(mutate_reservation_case, r)
}

/// The generators, by endpoint.
const GENERATORS: [(&str, Generator); 13] = [
    ("mutate-elastic-quota", mutate_quota),
    ("validate-elastic-quota", validate_quota),
    ("mutate-node-status", node_status_case),
    ("validate-pod-quota", pod_quota_case),
    ("validate-configmap", slo_config_case),
    ("mutate-pod", mutate_pod_case),
    ("validate-pod", validate_pod_case),
    ("mutate-reservation", mutate_reservation_case),
    ("validate-node", validate_node_case),
    ("mutate-elastic-quota-again", mutate_quota_again),
    ("mutate-node-status-again", node_status_again),
    ("mutate-pod-again", mutate_pod_again),
    ("mutate-reservation-again", mutate_reservation_again),
];

/// One case through both sides, classified.
fn compare(
    koordinator: &mut Koordinator,
    name: &str,
    case_seed: u64,
    generate: Generator,
) -> Result<bool, String> {
    let case = generate(&mut Rng(case_seed));
    let a = ours(&case);
    // Koordinator iterates maps in random order, so its own answer can vary: a few runs.
    let mut b = theirs(koordinator, &case);
    for _ in 0..4 {
        if b.as_ref().is_ok_and(|b| !agree(&a, b)) {
            b = theirs(koordinator, &case);
        }
    }
    match b {
        Err(e) => Err(format!("{name} seed {case_seed}: Koordinator's side failed: {e}")),
        Ok(b) if agree(&a, &b) => Ok(true),
        Ok(b) if deliberate(&a, &b) => Ok(false),
        // A profile whose selector does not parse applies to no pod here and to every pod in
        // Koordinator (docs/admission.md): the same as Koordinator without that profile.
        Ok(_) if without_malformed_profiles(&case).is_some_and(|without| {
            theirs(koordinator, &without).is_ok_and(|b| agree(&a, &b))
        }) =>
        {
            Ok(false)
        }
        Ok(b) => Err(format!(
            "{name} seed {case_seed}:\n  case: {}\n  ours:   {}\n  theirs: {}",
            serde_json::to_string(&json!({"objects": case.objects, "review": case.review["request"], "gates": case.gates})).unwrap(),
            shown(&a),
            shown(&b)
        )),
    }
}

/// An answer as one line of JSON.
fn shown(answer: &Answer) -> String {
    json!({"allowed": answer.allowed, "code": answer.code, "message": answer.message, "patched": answer.patched}).to_string()
}

/// The case without its ClusterColocationProfiles whose selector (or, for a namespaced object,
/// namespaceSelector) does not parse; `None` when it has none.
fn without_malformed_profiles(case: &Case) -> Option<Case> {
    // A cluster-scoped object (a Reservation) meets no namespaceSelector, in both.
    let fields: &[&str] = if case.review["request"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        &["selector"]
    } else {
        &["selector", "namespaceSelector"]
    };
    let malformed = |o: &Value| {
        o["kind"] == "ClusterColocationProfile"
            && fields.iter().any(|field| {
                serde_json::from_value::<
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
                >(o["spec"][field].clone())
                .is_ok_and(|s| koord_webhook::selectors::validate(&s).is_err())
            })
    };
    if !case.objects.iter().any(malformed) {
        return None;
    }
    let mut without = case.clone();
    without.objects.retain(|o| !malformed(o));
    Some(without)
}

/// Runs `cases` seeded cases of each generator on two threads, each feeding one Koordinator process
/// (`--lines`), and reports per endpoint.
pub fn run(seed: u64, cases: usize) -> Vec<EndpointReport> {
    let harness = harness();
    // CONFORMANCE_ONLY=ENDPOINT runs one generator.
    let only = std::env::var("CONFORMANCE_ONLY").ok();
    GENERATORS
        .iter()
        .filter(|(name, _)| only.as_deref().is_none_or(|o| o == *name))
        .map(|&(name, generate)| {
            let seeds: Vec<u64> = (0..cases)
                .map(|i| seed ^ ((i as u64) << 20) ^ name.len() as u64)
                .collect();
            let results: Vec<Result<bool, String>> = std::thread::scope(|scope| {
                let workers: Vec<_> = seeds
                    .chunks(cases.div_ceil(2).max(1))
                    .map(|chunk| {
                        let harness = &harness;
                        scope.spawn(move || {
                            let mut koordinator = Koordinator::new(harness);
                            chunk
                                .iter()
                                .map(|&s| compare(&mut koordinator, name, s, generate))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .flat_map(|w| w.join().expect("a conformance worker panicked"))
                    .collect()
            });
            let mut report = EndpointReport {
                endpoint: name,
                cases,
                ..Default::default()
            };
            for result in results {
                match result {
                    Ok(true) => report.identical += 1,
                    Ok(false) => report.documented += 1,
                    Err(e) => report.unexplained.push(e),
                }
            }
            report
        })
        .collect()
}

/// The report as markdown (`just conformance N` writes it to conformance/REPORT.md).
fn markdown(seed: u64, reports: &[EndpointReport]) -> String {
    let mut out = format!(
        "# Conformance report\n\nGenerated by `just conformance {}` (seed {seed}): random cases per endpoint \
         through Koordinator v1.8.0's handlers and koord-webhook's, compared as docs/admission.md \
         (\"Agreement with Koordinator, measured\") says.\n\n\
         | endpoint | cases | identical | documented | unexplained |\n| --- | ---: | ---: | ---: | ---: |\n",
        reports.first().map_or(0, |r| r.cases)
    );
    for r in reports {
        out += &format!(
            "| {} | {} | {} | {} | {} |\n",
            r.endpoint,
            r.cases,
            r.identical,
            r.documented,
            r.unexplained.len()
        );
    }
    out
}

#[test]
fn random_reviews_answer_as_koordinator_does() {
    let seed = std::env::var("CONFORMANCE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let cases = std::env::var("CONFORMANCE_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let reports = run(seed, cases);
    let report = markdown(seed, &reports);
    eprintln!("{report}");
    if let Some(path) = std::env::var_os("CONFORMANCE_REPORT") {
        std::fs::write(&path, &report).expect("the report is written");
    }
    let unexplained: Vec<&String> = reports.iter().flat_map(|r| &r.unexplained).collect();
    for d in &unexplained {
        eprintln!("{d}");
    }
    assert!(
        unexplained.is_empty(),
        "{} unexplained differences from Koordinator v1.8.0",
        unexplained.len()
    );
}

#[test]
fn parser_words_are_cut_from_messages() {
    let ours = "failed to unmarshal node raw allocatable: expected value at line 1 column 1";
    let theirs = "failed to unmarshal node raw allocatable: invalid character 'b' looking for beginning of value";
    assert_eq!(
        without_parser_words(ours),
        Some("failed to unmarshal node raw allocatable")
    );
    assert_eq!(
        without_parser_words(theirs),
        Some("failed to unmarshal node raw allocatable")
    );
    assert_eq!(
        without_parser_words("expected ident at line 1 column 2"),
        Some("")
    );
    assert_eq!(without_parser_words("exceeded quota"), None);
}
