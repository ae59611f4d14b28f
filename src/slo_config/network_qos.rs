//! Network QoS of `resource-qos-config`, checked as Koordinator v1.8.0 checks it, in its order:
//! each value an integer percentage 0-100 or a quantity; one kind of request per strategy; then
//! two budgets per strategy, each for ingress and egress requests apart: 100, and the node's
//! `totalNetworkBandwidth` from `system-config` in bytes.
//!
//! Koordinator takes every request from both budgets, an integer as a number and a quantity as its
//! bytes: a quantity request over 100 bytes overdraws the percentage budget, and an integer request
//! overdraws a bandwidth that is not set (0). Followed as it is, deliberately (docs/admission.md):
//! a configuration Koordinator's webhook refuses never reaches its koordlet through ours.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::types::{GoQuantity, NetworkQos, ResourceQosCfg, ResourceQosStrategy, SystemCfg};
use crate::resources::Qty;

/// Where a strategy sits, for the messages.
#[derive(Clone, Copy)]
enum Place {
    Cluster,
    Node(usize),
}

impl Place {
    /// Its field path as Koordinator's messages print it.
    fn path(self) -> String {
        match self {
            Place::Cluster => "ResourceQOSCfg.ClusterStrategy".to_owned(),
            Place::Node(i) => format!("ResourceQOSCfg.nodeStrategy.{i}"),
        }
    }
}

/// Checks `cfg` against the same ConfigMap's system config; without one (`null`) Koordinator
/// checks nothing of network QoS.
pub fn check(cfg: &ResourceQosCfg, system: Option<&SystemCfg>) -> Result<(), String> {
    let Some(system) = system else {
        return Ok(());
    };
    let strategies: Vec<(Place, &ResourceQosStrategy)> = cfg
        .cluster_strategy
        .iter()
        .map(|s| (Place::Cluster, s))
        .chain(
            cfg.node_strategies
                .iter()
                .enumerate()
                .map(|(i, n)| (Place::Node(i), &n.strategy)),
        )
        .collect();
    for &(place, strategy) in &strategies {
        check_values(strategy, place)?;
    }
    for &(place, strategy) in &strategies {
        one_kind(strategy, place)?;
    }
    for &(place, strategy) in &strategies {
        if overdraws(strategy, 100) {
            return Err(match place {
                Place::Cluster => {
                    "ClusterStrategy total net bandwidth percentage already over 100".into()
                }
                Place::Node(i) => {
                    format!(
                        "cfg.NodeStrategies[{i}] total net bandwidth percentage already over 100"
                    )
                }
            });
        }
    }
    let bytes = |q: Option<&GoQuantity>| q.map_or(0, |q| whole_units(q.0));
    if let (Some(strategy), Some(system_cluster)) =
        (&cfg.cluster_strategy, &system.cluster_strategy)
        && overdraws(
            strategy,
            bytes(system_cluster.total_network_bandwidth.as_ref()),
        )
    {
        return Err("total net bandwidth over total network bandwidth in clusterStrategy".into());
    }
    for (i, node) in cfg.node_strategies.iter().enumerate() {
        // The system's cluster value when it has no node strategies, else the system node
        // strategy with the same selector; none is 0.
        let total = match &system.cluster_strategy {
            Some(cluster) if system.node_strategies.is_empty() => {
                cluster.total_network_bandwidth.as_ref()
            }
            _ => system
                .node_strategies
                .iter()
                .find(|n| n.profile.node_selector == node.profile.node_selector)
                .and_then(|n| n.strategy.total_network_bandwidth.as_ref()),
        };
        if overdraws(&node.strategy, bytes(total)) {
            return Err(format!(
                "total net bandwidth quantity already over total network bandwidth in cfg.NodeStrategies[{i}]"
            ));
        }
    }
    Ok(())
}

/// A quantity in whole units, rounded up (Kubernetes' `Value()`).
fn whole_units(q: Qty) -> i128 {
    let milli = q.milli();
    milli / 1000 + i128::from(milli % 1000 > 0)
}

fn classes(strategy: &ResourceQosStrategy) -> [(&'static str, Option<&NetworkQos>); 3] {
    fn net(c: &Option<super::types::ResourceQos>) -> Option<&NetworkQos> {
        c.as_ref().and_then(|c| c.network_qos.as_ref())
    }
    [
        ("LSRClass", net(&strategy.lsr_class)),
        ("LSClass", net(&strategy.ls_class)),
        ("BEClass", net(&strategy.be_class)),
    ]
}

/// Each value is an integer percentage 0-100 or a quantity.
fn check_values(strategy: &ResourceQosStrategy, place: Place) -> Result<(), String> {
    for (class, net) in classes(strategy) {
        let Some(net) = net else { continue };
        for (field, value) in [
            ("IngressRequest", &net.ingress_request),
            ("IngressLimit", &net.ingress_limit),
            ("EgressRequest", &net.egress_request),
            ("EgressLimit", &net.egress_limit),
        ] {
            let path = format!("{}.{class}.{field}", place.path());
            match value {
                Some(IntOrString::Int(v)) if !(0..=100).contains(v) => {
                    return Err(format!(
                        "{path}: Invalid value: {v}: must be percentage value just in 0-100'"
                    ));
                }
                Some(IntOrString::String(s)) if s.parse::<Qty>().is_err() => {
                    return Err(format!(
                        "{path}: Invalid value: {s:?}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// The requests of a strategy, ingress and egress.
fn requests(strategy: &ResourceQosStrategy) -> [Vec<&IntOrString>; 2] {
    let nets: Vec<&NetworkQos> = classes(strategy).iter().filter_map(|(_, n)| *n).collect();
    [
        nets.iter()
            .filter_map(|n| n.ingress_request.as_ref())
            .collect(),
        nets.iter()
            .filter_map(|n| n.egress_request.as_ref())
            .collect(),
    ]
}

/// Integer percentages and quantities may not be mixed among one strategy's requests.
fn one_kind(strategy: &ResourceQosStrategy, place: Place) -> Result<(), String> {
    let all: Vec<&IntOrString> = requests(strategy).into_iter().flatten().collect();
    let ints = all.iter().any(|r| matches!(r, IntOrString::Int(_)));
    let strings = all.iter().any(|r| matches!(r, IntOrString::String(_)));
    if ints && strings {
        return Err(match place {
            Place::Cluster => {
                "only one type can be used for percentages or quantity in clusterStrategy".into()
            }
            Place::Node(i) => {
                format!(
                    "only one type can be used for percentages or quantity in nodeStrategy[{i}]"
                )
            }
        });
    }
    Ok(())
}

/// Whether the ingress or the egress requests, an integer as its number and a quantity as its
/// bytes (one that does not parse as nothing), add up to more than `budget`.
fn overdraws(strategy: &ResourceQosStrategy, budget: i128) -> bool {
    requests(strategy).iter().any(|direction| {
        let used: i128 = direction
            .iter()
            .map(|r| match r {
                IntOrString::Int(v) => i128::from(*v),
                IntOrString::String(s) => s.parse::<Qty>().map_or(0, whole_units),
            })
            .sum();
        budget - used < 0
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qos(v: serde_json::Value) -> ResourceQosCfg {
        serde_json::from_value(v).unwrap()
    }

    fn net(class: &str, net: serde_json::Value) -> serde_json::Value {
        json!({ class: {"networkQOS": net} })
    }

    /// A system config with this cluster bandwidth (`None`: a cluster strategy without one).
    fn system(total: Option<&str>) -> SystemCfg {
        serde_json::from_value(json!({"clusterStrategy": {"totalNetworkBandwidth": total}}))
            .unwrap()
    }

    #[test]
    fn percentages_and_quantities() {
        let sys = system(Some("1G"));
        let bad = qos(json!({"clusterStrategy": net("lsClass", json!({"ingressLimit": 150}))}));
        assert_eq!(
            check(&bad, Some(&sys)).unwrap_err(),
            "ResourceQOSCfg.ClusterStrategy.LSClass.IngressLimit: Invalid value: 150: must be percentage value just in 0-100'"
        );
        // Without a system config (`null`), Koordinator checks nothing of network QoS.
        assert_eq!(check(&bad, None), Ok(()));
        let bad = qos(
            json!({"nodeStrategies": [{"name": "n", "nodeSelector": {"matchLabels": {"a": "b"}},
            "beClass": {"networkQOS": {"egressLimit": ""}}}]}),
        );
        assert!(check(&bad, Some(&sys)).unwrap_err().starts_with(
            "ResourceQOSCfg.nodeStrategy.0.BEClass.EgressLimit: Invalid value: \"\": quantities must match"
        ));
        let mixed = qos(
            json!({"nodeStrategies": [{"name": "n", "nodeSelector": {"matchLabels": {"a": "b"}},
            "lsClass": {"networkQOS": {"ingressRequest": 10}}, "beClass": {"networkQOS": {"egressRequest": "10M"}}}]}),
        );
        assert_eq!(
            check(&mixed, Some(&sys)).unwrap_err(),
            "only one type can be used for percentages or quantity in nodeStrategy[0]"
        );
    }

    #[test]
    fn budgets_as_koordinator_keeps_them() {
        let sys = system(Some("1G"));
        let over = qos(
            json!({"clusterStrategy": {"lsrClass": {"networkQOS": {"ingressRequest": 60}},
            "beClass": {"networkQOS": {"ingressRequest": 50}}}}),
        );
        assert_eq!(
            check(&over, Some(&sys)).unwrap_err(),
            "ClusterStrategy total net bandwidth percentage already over 100"
        );
        let within = qos(
            json!({"clusterStrategy": {"lsrClass": {"networkQOS": {"ingressRequest": 60, "egressRequest": 60}},
            "beClass": {"networkQOS": {"egressRequest": 40}}}}),
        );
        assert_eq!(check(&within, Some(&sys)), Ok(()));
        // A quantity is taken from the 100 as its bytes: 100 bytes fit, 101 do not.
        let bytes = |b: &str| {
            qos(json!({"clusterStrategy": {"lsrClass": {"networkQOS": {"ingressRequest": b}}}}))
        };
        assert_eq!(check(&bytes("100"), Some(&sys)), Ok(()));
        assert_eq!(check(&bytes("0.1k"), Some(&sys)), Ok(()));
        assert_eq!(
            check(&bytes("101"), Some(&sys)).unwrap_err(),
            "ClusterStrategy total net bandwidth percentage already over 100"
        );
        assert_eq!(
            check(&bytes("500M"), Some(&sys)).unwrap_err(),
            "ClusterStrategy total net bandwidth percentage already over 100"
        );
        // A percentage is taken from the bandwidth as bytes: an unset one (0) refuses any request.
        let ten =
            qos(json!({"clusterStrategy": {"lsrClass": {"networkQOS": {"ingressRequest": 10}}}}));
        assert_eq!(check(&ten, Some(&sys)), Ok(()));
        assert_eq!(
            check(&ten, Some(&system(None))).unwrap_err(),
            "total net bandwidth over total network bandwidth in clusterStrategy"
        );
        // No cluster strategy in the system config: the cluster's requests are not measured.
        assert_eq!(check(&ten, Some(&SystemCfg::default())), Ok(()));
        // A node strategy: the system's cluster value when it has no node strategies, else the one
        // with the same selector, else 0.
        let node = qos(
            json!({"nodeStrategies": [{"name": "n", "nodeSelector": {"matchLabels": {"a": "b"}},
            "lsClass": {"networkQOS": {"egressRequest": 20}}}]}),
        );
        assert_eq!(check(&node, Some(&sys)), Ok(()));
        assert_eq!(
            check(&node, Some(&system(Some("19")))).unwrap_err(),
            "total net bandwidth quantity already over total network bandwidth in cfg.NodeStrategies[0]"
        );
        let with_nodes = |selector: serde_json::Value| -> SystemCfg {
            serde_json::from_value(json!({"clusterStrategy": {"totalNetworkBandwidth": "1G"},
                "nodeStrategies": [{"name": "s", "nodeSelector": selector, "totalNetworkBandwidth": "30"}]}))
            .unwrap()
        };
        assert_eq!(
            check(&node, Some(&with_nodes(json!({"matchLabels": {"a": "b"}})))),
            Ok(())
        );
        assert_eq!(
            check(&node, Some(&with_nodes(json!({"matchLabels": {"a": "c"}})))).unwrap_err(),
            "total net bandwidth quantity already over total network bandwidth in cfg.NodeStrategies[0]"
        );
    }
}
