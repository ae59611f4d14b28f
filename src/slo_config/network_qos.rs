//! Network QoS of `resource-qos-config`: each value an
//! integer percentage 0-100 or a quantity; one kind of request per strategy; integer requests within
//! 100 %; quantity requests within the node's `totalNetworkBandwidth` from `system-config` when known.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::types::{GoQuantity, NetworkQos, ResourceQosCfg, ResourceQosStrategy, SystemCfg};
use crate::resources::Qty;

/// Where a strategy sits, for the messages.
#[derive(Clone, Copy)]
enum Place {
    Cluster,
    Node(usize),
}

pub fn check(cfg: &ResourceQosCfg, system: Option<&SystemCfg>) -> Result<(), String> {
    let system_cluster_total = system
        .and_then(|s| s.cluster_strategy.as_ref())
        .and_then(|s| s.total_network_bandwidth.as_ref());
    if let Some(strategy) = &cfg.cluster_strategy {
        check_strategy(strategy, Place::Cluster, total(system_cluster_total))?;
    }
    for (i, node) in cfg.node_strategies.iter().enumerate() {
        // The system node strategy with the same selector, else the cluster value when the system
        // config has no node strategies.
        let node_total = match system {
            Some(s) if s.node_strategies.is_empty() => system_cluster_total,
            Some(s) => s
                .node_strategies
                .iter()
                .find(|n| n.profile.node_selector == node.profile.node_selector)
                .and_then(|n| n.strategy.total_network_bandwidth.as_ref()),
            None => None,
        };
        check_strategy(&node.strategy, Place::Node(i), total(node_total))?;
    }
    Ok(())
}

/// A usable, non-zero total.
fn total(q: Option<&GoQuantity>) -> Option<Qty> {
    q.map(|q| q.0).filter(|q| !q.is_zero())
}

fn classes(strategy: &ResourceQosStrategy) -> [(&'static str, Option<&NetworkQos>); 3] {
    fn net(c: &Option<super::types::ResourceQos>) -> Option<&NetworkQos> {
        c.as_ref().and_then(|c| c.network_qos.as_ref())
    }
    [
        ("lsrClass", net(&strategy.lsr_class)),
        ("lsClass", net(&strategy.ls_class)),
        ("beClass", net(&strategy.be_class)),
    ]
}

fn check_strategy(
    strategy: &ResourceQosStrategy,
    place: Place,
    total_bandwidth: Option<Qty>,
) -> Result<(), String> {
    let prefix = match place {
        Place::Cluster => "clusterStrategy".to_owned(),
        Place::Node(i) => format!("nodeStrategies[{i}]"),
    };
    let classes = classes(strategy);
    for (class, net) in classes {
        let Some(net) = net else { continue };
        for (field, value) in [
            ("ingressRequest", &net.ingress_request),
            ("ingressLimit", &net.ingress_limit),
            ("egressRequest", &net.egress_request),
            ("egressLimit", &net.egress_limit),
        ] {
            let path = format!("{prefix}.{class}.networkQOS.{field}");
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

    let requests: Vec<&IntOrString> = classes
        .iter()
        .filter_map(|(_, net)| *net)
        .flat_map(|n| [&n.ingress_request, &n.egress_request])
        .flatten()
        .collect();
    let ints = requests.iter().any(|r| matches!(r, IntOrString::Int(_)));
    let strings = requests.iter().any(|r| matches!(r, IntOrString::String(_)));
    if ints && strings {
        return Err(match place {
            Place::Cluster => {
                "only one type can be used for percentages or quantity in clusterStrategy".into()
            }
            Place::Node(i) => format!(
                "only one type can be used for percentages or quantity in nodeStrategy[{i}]"
            ),
        });
    }

    for pick in [
        (|n: &NetworkQos| n.ingress_request.clone()) as fn(&NetworkQos) -> Option<IntOrString>,
        |n: &NetworkQos| n.egress_request.clone(),
    ] {
        let values: Vec<IntOrString> = classes
            .iter()
            .filter_map(|(_, net)| net.and_then(pick))
            .collect();
        let percent: i64 = values
            .iter()
            .filter_map(|v| match v {
                IntOrString::Int(p) => Some(i64::from(*p)),
                IntOrString::String(_) => None,
            })
            .sum();
        if 100 - percent < 0 {
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
        let Some(total_bandwidth) = total_bandwidth else {
            continue;
        };
        let quantity = values
            .iter()
            .filter_map(|v| match v {
                IntOrString::String(s) => s.parse::<Qty>().ok(),
                IntOrString::Int(_) => None,
            })
            .fold(Qty::ZERO, Qty::plus);
        if quantity.milli() > total_bandwidth.milli() {
            return Err(match place {
                Place::Cluster => {
                    "total net bandwidth over total network bandwidth in clusterStrategy".into()
                }
                Place::Node(i) => format!(
                    "total net bandwidth quantity already over total network bandwidth in cfg.NodeStrategies[{i}]"
                ),
            });
        }
    }
    Ok(())
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

    fn system(total: &str) -> SystemCfg {
        serde_json::from_value(json!({"clusterStrategy": {"totalNetworkBandwidth": total}}))
            .unwrap()
    }

    #[test]
    fn percentages_and_quantities() {
        let bad = qos(json!({"clusterStrategy": net("lsClass", json!({"ingressLimit": 150}))}));
        assert_eq!(
            check(&bad, None).unwrap_err(),
            "clusterStrategy.lsClass.networkQOS.ingressLimit: Invalid value: 150: must be percentage value just in 0-100'"
        );
        let bad = qos(json!({"clusterStrategy": net("beClass", json!({"egressLimit": ""}))}));
        assert!(check(&bad, None).unwrap_err().starts_with(
            "clusterStrategy.beClass.networkQOS.egressLimit: Invalid value: \"\": quantities must match"
        ));
        let mixed = qos(
            json!({"nodeStrategies": [{"name": "n", "nodeSelector": {"matchLabels": {"a": "b"}},
            "lsClass": {"networkQOS": {"ingressRequest": 10}}, "beClass": {"networkQOS": {"egressRequest": "10M"}}}]}),
        );
        assert_eq!(
            check(&mixed, None).unwrap_err(),
            "only one type can be used for percentages or quantity in nodeStrategy[0]"
        );
    }

    #[test]
    fn budgets() {
        let over = qos(
            json!({"clusterStrategy": {"lsrClass": {"networkQOS": {"ingressRequest": 60}},
            "beClass": {"networkQOS": {"ingressRequest": 50}}}}),
        );
        assert_eq!(
            check(&over, None).unwrap_err(),
            "ClusterStrategy total net bandwidth percentage already over 100"
        );
        // Quantities are not taken from the 100 % budget (a decision against Koordinator's quirk).
        let quantities = qos(
            json!({"clusterStrategy": {"lsrClass": {"networkQOS": {"ingressRequest": "500M"}},
            "beClass": {"networkQOS": {"ingressRequest": "600M"}}}}),
        );
        assert_eq!(check(&quantities, None), Ok(()));
        assert_eq!(check(&quantities, Some(&system("2G"))), Ok(()));
        assert_eq!(
            check(&quantities, Some(&system("1G"))).unwrap_err(),
            "total net bandwidth over total network bandwidth in clusterStrategy"
        );
        let node = qos(
            json!({"nodeStrategies": [{"name": "n", "nodeSelector": {"matchLabels": {"a": "b"}},
            "lsClass": {"networkQOS": {"egressRequest": "2G"}}}]}),
        );
        assert_eq!(
            check(&node, Some(&system("1G"))).unwrap_err(),
            "total net bandwidth quantity already over total network bandwidth in cfg.NodeStrategies[0]"
        );
        let with_nodes: SystemCfg = serde_json::from_value(json!({"clusterStrategy": {"totalNetworkBandwidth": "1G"},
            "nodeStrategies": [{"name": "s", "nodeSelector": {"matchLabels": {"a": "b"}}, "totalNetworkBandwidth": "3G"}]})).unwrap();
        assert_eq!(check(&node, Some(&with_nodes)), Ok(()));
    }
}
