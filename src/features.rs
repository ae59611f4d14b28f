//! Feature gates: the table of names and defaults (docs/admission.md, conventions) and the
//! `--feature-gates Name=true,...` parser.

use std::fmt;
use std::str::FromStr;

/// Defines [`Gate`] and its table from one list: each gate's name as users write it is the
/// variant's, so the two cannot drift apart; its default here, Koordinator v1.8.0's (`none`: a gate
/// of ours or of a later Koordinator), and what it turns on, from which docs/admission.md's gate
/// table is generated (`doc-tables`, checked in `tests/it/generated.rs`).
macro_rules! gates {
    ($($gate:ident = $default:literal, koordinator $koord:ident, $what:literal;)*) => {
        /// Every gate koord-webhook knows. The order is the order `--help` and `status` print them in.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Gate {
            $($gate,)*
        }

        /// (gate, name, default), in the enum's order: a gate's discriminant is its row.
        const TABLE: &[(Gate, &str, bool)] = &[$((Gate::$gate, stringify!($gate), $default),)*];

        /// (Koordinator v1.8.0's default, what the gate turns on), in the same order.
        const ABOUT: &[(Option<bool>, &str)] = &[$((gates!(@koord $koord), $what),)*];
    };
    (@koord none) => { None };
    (@koord on) => { Some(true) };
    (@koord off) => { Some(false) };
}

// One line per gate, with its default, reviewable against the spec (docs/admission.md).
gates! {
    PodMutatingWebhook = true, koordinator on, "serves `/mutate-pod` and registers its entries";
    PodValidatingWebhook = true, koordinator on, "serves `/validate-pod` and registers its entries";
    ElasticMutatingWebhook = true, koordinator on, "serves the ElasticQuota mutating endpoint";
    ElasticValidatingWebhook = true, koordinator on, "serves the ElasticQuota validating endpoint";
    NodeMutatingWebhook = true, koordinator off, "serves `/mutate-node-status` (node amplification)";
    NodeValidatingWebhook = true, koordinator off, "serves `/validate-node`";
    ConfigMapValidatingWebhook = true, koordinator off, "serves `/validate-configmap` (the slo-controller ConfigMap)";
    ReservationMutatingWebhook = true, koordinator off, "serves `/mutate-reservation`";
    ColocationProfileSkipMutatingResources = false, koordinator off, "a ClusterColocationProfile leaves the pod's resources as they are (no translation to batch or mid resources)";
    ColocationProfileSkipValidatingPriority = false, koordinator off, "an UPDATE may change the `koordinator.sh/priority` label";
    MultiQuotaTree = false, koordinator off, "`MultiQuotaTreeAffinity`: a pod of a quota tree gets that tree's node affinity";
    DisableExtendedResourceSpec = false, koordinator none, "`ExtendedResourceSpec` off: batch and mid resources are not recorded in the pod's annotation";
    DisableDeviceResourceSpec = false, koordinator none, "`DeviceResourceSpec` off: device resources are not normalised";
    ValidatePodDeviceResource = false, koordinator off, "`DeviceResource`: a pod's device requests are checked";
    EnableQuotaAdmission = false, koordinator off, "`ElasticQuotaEvaluation`: a pod's requests are checked against its quota and charged to `child-request`";
    EnableQuotaAdmissionOnUpdate = false, koordinator none, "the quota evaluation on pod UPDATE too";
    ElasticQuotaEvaluationTransformPod = false, koordinator off, "the quota evaluation reads the pod as transformed (with `ReplaceResourcesTransformer`)";
    ReplaceResourcesTransformer = false, koordinator off, "with `ElasticQuotaEvaluationTransformPod`: the replace-resources annotation replaces the pod's requests";
    DisableDefaultQuota = false, koordinator off, "a pod without a quota label is not charged to its namespace's quota or the default quota";
    SupportParentQuotaSubmitPod = false, koordinator off, "a pod may name a parent quota";
    ElasticQuotaEnableUpdateResourceKey = false, koordinator off, "a child quota's max keys must be among its parent's (instead of equal to them)";
    ElasticQuotaGuaranteeUsage = false, koordinator off, "a quota's min must be within its guaranteed capacity up the tree";
    EnablePodEnhancedValidator = false, koordinator off, "`PodEnhancedValidator`: the pod checks of Koordinator's enhanced validator";
    AmplifyNodeCapacity = true, koordinator none, "node amplification multiplies `capacity` too (kept in `raw-capacity`); off, capacity is left as reported, as v1.8.0 leaves it";
    ReservationAffinityValidation = false, koordinator none, "`ReservationAffinity`: a pod's reservation affinity is checked";
    ReservationTtlLimit = true, koordinator none, "a new Reservation's `ttl` is held to `--max-reservation-ttl` (no limit unless that flag is set)";
}

impl Gate {
    pub fn all() -> impl Iterator<Item = Gate> {
        TABLE.iter().map(|(g, _, _)| *g)
    }

    pub fn name(self) -> &'static str {
        TABLE[self as usize].1
    }

    pub fn default_enabled(self) -> bool {
        TABLE[self as usize].2
    }

    /// Koordinator v1.8.0's default; `None` for a gate it does not have.
    pub fn koordinator_default(self) -> Option<bool> {
        ABOUT[self as usize].0
    }

    /// What the gate turns on (docs/admission.md's gate table).
    pub fn what(self) -> &'static str {
        ABOUT[self as usize].1
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GateError {
    #[error("unknown feature gate {0:?} (known: {known})", known = known_names())]
    Unknown(String),
    #[error("feature gate {0:?} needs a value: Name=true or Name=false")]
    MissingValue(String),
    #[error("feature gate {name}: {value:?} is not true or false")]
    BadValue { name: String, value: String },
}

fn known_names() -> String {
    TABLE
        .iter()
        .map(|(_, n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The state of every gate. Cheap to copy; read on every request.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FeatureGates {
    enabled: [bool; TABLE.len()],
}

impl Default for FeatureGates {
    fn default() -> Self {
        let mut enabled = [false; TABLE.len()];
        for (gate, _, default) in TABLE {
            enabled[*gate as usize] = *default;
        }
        Self { enabled }
    }
}

impl FeatureGates {
    pub fn enabled(&self, gate: Gate) -> bool {
        self.enabled[gate as usize]
    }

    pub fn set(&mut self, gate: Gate, on: bool) {
        self.enabled[gate as usize] = on;
    }

    /// The gates that differ from their default, in the `--feature-gates` syntax.
    pub fn overrides(&self) -> String {
        Gate::all()
            .filter(|g| self.enabled(*g) != g.default_enabled())
            .map(|g| format!("{}={}", g, self.enabled(g)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl fmt::Debug for FeatureGates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(Gate::all().map(|g| (g.name(), self.enabled(g))))
            .finish()
    }
}

impl FromStr for FeatureGates {
    type Err = GateError;

    /// Parses `A=true,B=false` on top of the defaults; whitespace around items is ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut gates = FeatureGates::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| GateError::MissingValue(item.to_owned()))?;
            let (name, value) = (name.trim(), value.trim());
            let gate = TABLE
                .iter()
                .find(|(_, n, _)| *n == name)
                .map(|(g, _, _)| *g)
                .ok_or_else(|| GateError::Unknown(name.to_owned()))?;
            let on = match value.to_ascii_lowercase().as_str() {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(GateError::BadValue {
                        name: name.to_owned(),
                        value: value.to_owned(),
                    });
                }
            };
            gates.set(gate, on);
        }
        Ok(gates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gate_is_named_as_its_variant() {
        for (i, gate) in Gate::all().enumerate() {
            assert_eq!(gate as usize, i);
            assert_eq!(gate.name(), format!("{gate:?}"));
        }
    }

    #[test]
    fn defaults_follow_the_spec() {
        let g = FeatureGates::default();
        assert!(g.enabled(Gate::NodeMutatingWebhook));
        assert!(g.enabled(Gate::ReservationMutatingWebhook));
        assert!(g.enabled(Gate::AmplifyNodeCapacity));
        assert!(!g.enabled(Gate::EnableQuotaAdmission));
        assert!(!g.enabled(Gate::ReservationAffinityValidation));
        assert_eq!(g.overrides(), "");
    }

    #[test]
    fn parses_overrides() {
        let g: FeatureGates = " PodMutatingWebhook=false, EnableQuotaAdmission=TRUE ,"
            .parse()
            .unwrap();
        assert!(!g.enabled(Gate::PodMutatingWebhook));
        assert!(g.enabled(Gate::EnableQuotaAdmission));
        assert_eq!(
            g.overrides(),
            "PodMutatingWebhook=false,EnableQuotaAdmission=true"
        );
    }

    #[test]
    fn rejects_unknown_and_malformed() {
        assert!(
            matches!("Nope=true".parse::<FeatureGates>(), Err(GateError::Unknown(n)) if n == "Nope")
        );
        assert!(matches!(
            "MultiQuotaTree".parse::<FeatureGates>(),
            Err(GateError::MissingValue(_))
        ));
        assert!(matches!(
            "MultiQuotaTree=yes".parse::<FeatureGates>(),
            Err(GateError::BadValue { .. })
        ));
        let msg = "Nope=true".parse::<FeatureGates>().unwrap_err().to_string();
        assert!(msg.contains("known: PodMutatingWebhook"), "{msg}");
    }
}
