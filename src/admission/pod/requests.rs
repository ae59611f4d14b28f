//! A pod's effective requests, as the scheduler computes them (Kubernetes `PodRequests`): the sum of
//! its containers, at least the largest init container (restartable sidecars stay running and add
//! up), plus the pod overhead.

use crate::admission::pod::object::{Container, Pod};

use crate::resources::{Resources, quantity::QuantityError};

fn requests(container: &Container) -> Result<Resources, QuantityError> {
    Resources::parse(
        container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref()),
    )
}

/// The first negative request of a container, init container or the overhead, as the API server's
/// validation words it (it refuses such a pod before admission, so only a request that did not come
/// through it can carry one).
pub fn negative_request(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let lists = spec
        .containers
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("spec.containers[{i}].resources.requests"), c))
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, c)| (format!("spec.initContainers[{i}].resources.requests"), c)),
        );
    for (path, container) in lists {
        let list = container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref());
        for (name, quantity) in list.into_iter().flatten() {
            if crate::resources::Qty::try_from(quantity).is_ok_and(|q| q.is_negative()) {
                return Some(format!(
                    "{path}[{name}]: Invalid value: \"{}\": must be greater than or equal to 0",
                    quantity.0
                ));
            }
        }
    }
    for (name, quantity) in spec.overhead.iter().flatten() {
        if crate::resources::Qty::try_from(quantity).is_ok_and(|q| q.is_negative()) {
            return Some(format!(
                "spec.overhead[{name}]: Invalid value: \"{}\": must be greater than or equal to 0",
                quantity.0
            ));
        }
    }
    None
}

pub fn pod_requests(pod: &Pod) -> Result<Resources, QuantityError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(Resources::default());
    };
    let mut total = Resources::default();
    for container in &spec.containers {
        total.add(&requests(container)?);
    }
    let mut sidecars = Resources::default();
    let mut init_peak = Resources::default();
    for init in spec.init_containers.iter().flatten() {
        let own = requests(init)?;
        if init.restart_policy.as_deref() == Some("Always") {
            total.add(&own);
            sidecars.add(&own);
        } else {
            let mut during = own;
            during.add(&sidecars);
            init_peak.max_with(&during);
        }
    }
    total.max_with(&init_peak);
    total.add(&Resources::parse(spec.overhead.as_ref())?);
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn containers_sum_init_peaks_sidecars_and_overhead() {
        let pod: Pod = serde_json::from_value(json!({
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "500m"}}}
                ],
                "initContainers": [
                    {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}},
                    {"name": "init", "resources": {"requests": {"cpu": "3", "memory": "512Mi"}}}
                ],
                "overhead": {"cpu": "10m"}
            }
        }))
        .unwrap();
        let r = pod_requests(&pod).unwrap();
        // containers 1.5 + sidecar 0.1 = 1.6 < init 3 + sidecar 0.1 = 3.1; + overhead 0.01
        assert_eq!(r.get("cpu").to_string(), "3110m");
        assert_eq!(r.get("memory").to_string(), "1Gi");
    }

    #[test]
    fn negative_requests_are_named_as_the_api_server_names_them() {
        let pod = |spec: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"spec": spec})).unwrap()
        };
        let plain =
            pod(json!({"containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}]}));
        assert_eq!(negative_request(&plain), None);
        let forged = pod(json!({"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1"}}},
            {"name": "b", "resources": {"requests": {"cpu": "-1000"}}}]}));
        assert_eq!(
            negative_request(&forged).as_deref(),
            Some(
                "spec.containers[1].resources.requests[cpu]: Invalid value: \"-1000\": must be greater than or equal to 0"
            )
        );
        let init = pod(json!({"containers": [], "initContainers": [
            {"name": "i", "resources": {"requests": {"memory": "-1Gi"}}}]}));
        assert!(
            negative_request(&init)
                .unwrap()
                .starts_with("spec.initContainers[0]")
        );
        let overhead = pod(json!({"containers": [], "overhead": {"cpu": "-1m"}}));
        assert!(
            negative_request(&overhead)
                .unwrap()
                .starts_with("spec.overhead[cpu]")
        );
    }
}
