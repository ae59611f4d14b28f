//! Each field rule and each error format of the slo-controller ConfigMap checks, through [`check_key`].

use serde_json::{Value, json};

use super::*;

fn env(name_need_check: bool) -> CheckEnv<'static> {
    CheckEnv {
        config_map: "koordinator-system/slo-controller-config",
        name_need_check,
        // A system config without strategies: network QoS is checked, against no bandwidth.
        system: Box::leak(Box::new(SystemForQos::Parsed(SystemCfg::default()))),
    }
}

fn err(key: ConfigKey, v: Value) -> String {
    check_key(key, &v.to_string(), &env(false))
        .expect_err("rejected")
        .to_string()
}

fn ok(key: ConfigKey, v: Value) {
    if let Err(e) = check_key(key, &v.to_string(), &env(false)) {
        panic!("{key:?} {v}: {e}");
    }
}

fn field_err(path: &str, message: &str) -> String {
    format!(r#"___{{"reason":"ConfigParamInvalid","message":{{"{path}":"{message}"}}}}___"#)
}

fn node(name: &str, labels: Value, rest: Value) -> Value {
    let mut v = json!({"name": name, "nodeSelector": {"matchLabels": labels}});
    v.as_object_mut()
        .unwrap()
        .extend(rest.as_object().unwrap().clone());
    v
}

#[test]
fn parse_failures_name_the_key() {
    let e = check_key(ConfigKey::Colocation, "{", &env(false))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with(r#"___{"reason":"ParseConfigFail","message":"Failed to parse colocation config in configmap koordinator-system/slo-controller-config, err: "#), "{e}");
    let e = err(
        ConfigKey::ResourceThreshold,
        json!({"clusterStrategy": {"cpuSuppressThresholdPercent": 1.5}}),
    );
    assert!(
        e.contains("Failed to parse resourceThreshold config"),
        "{e}"
    );
    let e = err(ConfigKey::CpuBurst, json!({"clusterStrategy": "x"}));
    assert!(e.contains("Failed to parse CpuBurst config"), "{e}");
}

#[test]
fn colocation_rules() {
    use ConfigKey::Colocation as K;
    let p = "ColocationCfg.ColocationStrategy";
    assert_eq!(
        err(K, json!({"metricAggregateDurationSeconds": 0})),
        field_err(
            &format!("{p}.MetricAggregateDurationSeconds"),
            "MetricAggregateDurationSeconds must be 1 or greater"
        )
    );
    assert_eq!(
        err(K, json!({"cpuReclaimThresholdPercent": -1})),
        field_err(
            &format!("{p}.CPUReclaimThresholdPercent"),
            "CPUReclaimThresholdPercent must be 0 or greater"
        )
    );
    ok(
        K,
        json!({"memoryReclaimThresholdPercent": 101, "cpuReclaimThresholdPercent": 250}),
    );
    assert_eq!(
        err(K, json!({"resourceDiffThreshold": 0})),
        field_err(
            &format!("{p}.ResourceDiffThreshold"),
            "ResourceDiffThreshold must be greater than 0"
        )
    );
    assert_eq!(
        err(K, json!({"resourceDiffThreshold": 1.5})),
        field_err(
            &format!("{p}.ResourceDiffThreshold"),
            "ResourceDiffThreshold must be 1 or less"
        )
    );
    assert_eq!(
        err(K, json!({"midCPUThresholdPercent": 101})),
        field_err(
            &format!("{p}.MidCPUThresholdPercent"),
            "MidCPUThresholdPercent must be 100 or less"
        )
    );
    let node_cfg = node("n", json!({"pool": "a"}), json!({"degradeTimeMinutes": 0}));
    assert_eq!(
        err(K, json!({"nodeConfigs": [node_cfg]})),
        field_err(
            "ColocationCfg.NodeConfigs[0].ColocationStrategy.DegradeTimeMinutes",
            "DegradeTimeMinutes must be 1 or greater"
        )
    );
    ok(
        K,
        json!({"enable": true, "metricAggregateDurationSeconds": 60, "resourceDiffThreshold": 0.1, "unknownField": 1}),
    );
}

#[test]
fn several_broken_fields_are_all_reported_sorted() {
    let e = err(
        ConfigKey::Colocation,
        json!({"updateTimeThresholdSeconds": 0, "degradeTimeMinutes": 0}),
    );
    assert_eq!(
        e,
        r#"___{"reason":"ConfigParamInvalid","message":{"ColocationCfg.ColocationStrategy.DegradeTimeMinutes":"DegradeTimeMinutes must be 1 or greater","ColocationCfg.ColocationStrategy.UpdateTimeThresholdSeconds":"UpdateTimeThresholdSeconds must be 1 or greater"}}___"#
    );
}

#[test]
fn resource_threshold_rules_and_pairs() {
    use ConfigKey::ResourceThreshold as K;
    let p = "ResourceThresholdCfg.ClusterStrategy";
    assert_eq!(
        err(
            K,
            json!({"clusterStrategy": {"cpuSuppressThresholdPercent": 101}})
        ),
        field_err(
            &format!("{p}.CPUSuppressThresholdPercent"),
            "CPUSuppressThresholdPercent must be 100 or less"
        )
    );
    // One side of a pair alone fails.
    assert_eq!(
        err(
            K,
            json!({"clusterStrategy": {"memoryEvictLowerPercent": 35}})
        ),
        field_err(
            &format!("{p}.MemoryEvictLowerPercent"),
            "MemoryEvictLowerPercent must be less than MemoryEvictThresholdPercent"
        )
    );
    ok(
        K,
        json!({"clusterStrategy": {"memoryEvictThresholdPercent": 70, "memoryEvictLowerPercent": 65}}),
    );
    let e = err(
        K,
        json!({"clusterStrategy": {"cpuEvictBESatisfactionUpperPercent": 50, "cpuEvictBESatisfactionLowerPercent": 50}}),
    );
    assert!(e.contains(r#""CPUEvictBESatisfactionUpperPercent must be greater than CPUEvictBESatisfactionLowerPercent""#), "{e}");
    assert!(e.contains(r#""CPUEvictBESatisfactionLowerPercent must be less than CPUEvictBESatisfactionUpperPercent""#), "{e}");
    assert_eq!(
        err(
            K,
            json!({"clusterStrategy": {"cpuEvictTimeWindowSeconds": 0}})
        ),
        field_err(
            &format!("{p}.CPUEvictTimeWindowSeconds"),
            "CPUEvictTimeWindowSeconds must be greater than 0"
        )
    );
    assert_eq!(
        err(
            K,
            json!({"clusterStrategy": {"allocatableEvictPriorityThreshold": 8000}})
        ),
        field_err(
            &format!("{p}.AllocatableEvictPriorityThreshold"),
            "AllocatableEvictPriorityThreshold must be 7,999 or less"
        )
    );
    let n = node(
        "n",
        json!({"pool": "a"}),
        json!({"cpuEvictThresholdPercent": 101, "cpuEvictLowerPercent": 10}),
    );
    assert_eq!(
        err(K, json!({"nodeStrategies": [n]})),
        field_err(
            "ResourceThresholdCfg.NodeStrategies[0].ResourceThresholdStrategy.CPUEvictThresholdPercent",
            "CPUEvictThresholdPercent must be 100 or less"
        )
    );
}

#[test]
fn resource_qos_rules() {
    use ConfigKey::ResourceQos as K;
    let p = "ResourceQOSCfg.ClusterStrategy";
    assert_eq!(
        err(
            K,
            json!({"clusterStrategy": {"lsrClass": {"cpuQOS": {"groupIdentity": 3}}}})
        ),
        field_err(
            &format!("{p}.LSRClass.CPUQOS.CPUQOS.GroupIdentity"),
            "GroupIdentity must be 2 or less"
        )
    );
    assert_eq!(
        err(
            K,
            json!({"clusterStrategy": {"beClass": {"memoryQOS": {"wmarkScalePermill": 0}}}})
        ),
        field_err(
            &format!("{p}.BEClass.MemoryQOS.MemoryQOS.WmarkScalePermill"),
            "WmarkScalePermill must be 1 or greater"
        )
    );
    assert_eq!(
        err(
            K,
            json!({"clusterStrategy": {"lsClass": {"memoryQOS": {"wmarkMinAdj": -26}}}})
        ),
        field_err(
            &format!("{p}.LSClass.MemoryQOS.MemoryQOS.WmarkMinAdj"),
            "WmarkMinAdj must be -25 or greater"
        )
    );
    assert_eq!(
        err(
            K,
            json!({"clusterStrategy": {"systemClass": {"resctrlQOS": {"catRangeStartPercent": 10}}}})
        ),
        field_err(
            &format!("{p}.SystemClass.ResctrlQOS.ResctrlQOS.CATRangeStartPercent"),
            "CATRangeStartPercent must be less than CATRangeEndPercent"
        )
    );
    ok(
        K,
        json!({"clusterStrategy": {"lsrClass": {"resctrlQOS": {"catRangeStartPercent": 0, "catRangeEndPercent": 100, "mbaPercent": 100}}}}),
    );
    // Network QoS runs after the field rules and answers in plain text.
    assert_eq!(
        err(
            K,
            json!({"clusterStrategy": {"lsrClass": {"networkQOS": {"ingressRequest": 70}}, "lsClass": {"networkQOS": {"ingressRequest": 40}}}})
        ),
        "ClusterStrategy total net bandwidth percentage already over 100"
    );
    // The system config is read with the QoS key: one that does not parse (absent: empty text)
    // refuses the QoS key, one that is `null` leaves network QoS unchecked.
    let over = json!({"clusterStrategy": {"lsrClass": {"networkQOS": {"ingressRequest": 170}}}});
    let with = |system: &SystemForQos| {
        let env = CheckEnv {
            system,
            ..env(false)
        };
        check_key(K, &over.to_string(), &env).map_err(|e| e.to_string())
    };
    assert!(
        with(&SystemForQos::read(None))
            .unwrap_err()
            .starts_with(r#"___{"reason":"ParseConfigFail","message":"Failed to parse System config in configmap koordinator-system/slo-controller-config, err: EOF"#)
    );
    assert!(with(&SystemForQos::read(Some(" null "))).is_ok());
    assert!(with(&SystemForQos::read(Some("{}"))).is_err());
}

#[test]
fn cpu_burst_and_system_rules() {
    assert_eq!(
        err(
            ConfigKey::CpuBurst,
            json!({"clusterStrategy": {"cpuBurstPercent": 0}})
        ),
        field_err(
            "CPUBurstCfg.ClusterStrategy.CPUBurstConfig.CPUBurstPercent",
            "CPUBurstPercent must be 1 or greater"
        )
    );
    assert_eq!(
        err(
            ConfigKey::CpuBurst,
            json!({"clusterStrategy": {"cfsQuotaBurstPeriodSeconds": -2}})
        ),
        field_err(
            "CPUBurstCfg.ClusterStrategy.CPUBurstConfig.CFSQuotaBurstPeriodSeconds",
            "CFSQuotaBurstPeriodSeconds must be -1 or greater"
        )
    );
    assert_eq!(
        err(
            ConfigKey::CpuBurst,
            json!({"clusterStrategy": {"sharePoolThresholdPercent": 101}})
        ),
        field_err(
            "CPUBurstCfg.ClusterStrategy.SharePoolThresholdPercent",
            "SharePoolThresholdPercent must be 100 or less"
        )
    );
    assert_eq!(
        err(
            ConfigKey::System,
            json!({"clusterStrategy": {"watermarkScaleFactor": 401}})
        ),
        field_err(
            "SystemCfg.ClusterStrategy.WatermarkScaleFactor",
            "WatermarkScaleFactor must be 400 or less"
        )
    );
    let n = node("n", json!({"pool": "a"}), json!({"minFreeKbytesFactor": 0}));
    assert_eq!(
        err(ConfigKey::System, json!({"nodeStrategies": [n]})),
        field_err(
            "SystemCfg.NodeStrategies[0].SystemStrategy.MinFreeKbytesFactor",
            "MinFreeKbytesFactor must be greater than 0"
        )
    );
}

#[test]
fn node_strategies_need_selectors_names_and_no_overlap() {
    use ConfigKey::CpuBurst as K;
    let e = err(
        K,
        json!({"nodeStrategies": [{"name": "a", "nodeSelector": {}}]}),
    );
    assert_eq!(
        e,
        r#"___{"reason":"ConfigParamInvalid","message":"nodeConfigs NodeSelector must not empty error! configType: cpu-burst-config,nodeConfig name:a"}___"#
    );
    let e = err(
        K,
        json!({"nodeStrategies": [{"name": "a", "nodeSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}]}),
    );
    assert_eq!(
        e,
        r#"___{"reason":"ConfigParamInvalid","message":"failed to parse node selector \u0026LabelSelector{MatchLabels:map[string]string{},MatchExpressions:[]LabelSelectorRequirement{LabelSelectorRequirement{Key:k,Operator:In,Values:[],},},},configType: cpu-burst-config,nodeConfig name:a, err: values: Invalid value: null: for 'in', 'notin' operators, values set can't be empty"}___"#
    );
    // Keys are read as Go reads them: in any letter case.
    let e = err(
        K,
        json!({"NODESTRATEGIES": [{"Name": "a", "nodeselector": {}}]}),
    );
    assert!(
        e.contains("must not empty error! configType: cpu-burst-config,nodeConfig name:a"),
        "{e}"
    );

    let unnamed = json!({"nodeStrategies": [{"nodeSelector": {"matchLabels": {"a": "1"}}}]});
    ok(K, unnamed.clone());
    let e = check_key(K, &unnamed.to_string(), &env(true))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        r#"___{"reason":"ConfigParamInvalid","message":"nodeConfig Name need! configType:cpu-burst-config"}___"#
    );
    let twice = json!({"nodeStrategies": [node("x", json!({"a": "1"}), json!({})), node("x", json!({"a": "2"}), json!({}))]});
    let e = check_key(K, &twice.to_string(), &env(true))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        r#"___{"reason":"ConfigParamInvalid","message":"nodeConfig Name confilict, configType:cpu-burst-config,nodeConfig Name:x! "}___"#
    );

    let overlapping = json!({"nodeStrategies": [node("x", json!({"a": "1"}), json!({})), node("y", json!({"a": "1", "b": "2"}), json!({}))]});
    assert_eq!(
        err(K, overlapping),
        r#"___{"reason":"NodeStrategiesOverlap","message":{"config":"cpu-burst-config","strategies":["x","y"]}}___"#
    );
}

#[test]
fn a_node_matching_two_strategies_conflicts() {
    let text = json!({"nodeStrategies": [node("x", json!({"a": "1"}), json!({})), node("y", json!({"b": "2"}), json!({}))]}).to_string();
    let parsed = check_key(ConfigKey::CpuBurst, &text, &env(false)).unwrap();
    let labels = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        node_conflict(ConfigKey::CpuBurst, &parsed, "n1", &labels(&[("a", "1")])),
        None
    );
    assert_eq!(
        node_conflict(
            ConfigKey::CpuBurst,
            &parsed,
            "n1",
            &labels(&[("a", "1"), ("b", "2")])
        )
        .unwrap()
        .to_string(),
        r#"___{"reason":"ExistNodeConfict","message":{"config":"cpu-burst-config","strategies":["x","y"],"exampleNodes":["n1"]}}___"#
    );
}

#[test]
fn lenient_parsing_skips_what_does_not_parse() {
    let data = [
        ("colocation-config", "{"),
        ("cpu-burst-config", r#"{"nodeStrategies": []}"#),
        ("system-config", ""),
        // A key with an unusable node selector is left out too (its checker does not start).
        (
            "resource-threshold-config",
            r#"{"nodeStrategies": [{"name": "a", "nodeSelector": {}}]}"#,
        ),
        (
            "resource-qos-config",
            r#"{"nodeStrategies": [{"name": "a", "nodeSelector": {"matchLabels": {"bad key!": "x"}}}]}"#,
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let parsed = parse_leniently(&data);
    assert_eq!(parsed.len(), 1);
    assert_eq!(parsed[0].0, ConfigKey::CpuBurst);
}

#[test]
fn a_bad_quantity_is_reported_before_a_type_mismatch_as_go_does() {
    let e = err(
        ConfigKey::System,
        json!({"clusterStrategy": {"minFreeKbytesFactor": "7", "TotalNetworkBandwidth": ""}}),
    );
    assert!(
        e.contains("err: quantities must match the regular expression"),
        "{e}"
    );
    // A bare number is a quantity to Go; null is zero.
    for total in [json!(-5), json!(null), json!(" 1Gi ")] {
        let text = json!({"clusterStrategy": {"totalNetworkBandwidth": total}}).to_string();
        assert!(Parsed::parse(ConfigKey::System, &text).is_ok(), "{text}");
    }
}

#[test]
fn bounds_are_printed_as_koordinators_validator_prints_them() {
    for (n, text) in [
        (0.0, "0"),
        (100.0, "100"),
        (1000.0, "1,000"),
        (7999.0, "7,999"),
        (10000.0, "10,000"),
        (1234567.0, "1,234,567"),
        (-25.0, "-25"),
        (-2500.0, "-2,500"),
        (0.5, "0.5"),
    ] {
        assert_eq!(rules::bound(n), text);
    }
}
