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
}
