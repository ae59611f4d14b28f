//! /validate-clustercolocationprofile: koord-webhook's own entry (Koordinator has none). It has no
//! rule of its own: it admits every profile once `mpod-create` covers the pods the profile selects
//! (docs/narrowing.md, "Pods"), and is registered only while calls are narrowed.

use super::chain::Validator;
use super::pod_reach_guard::GuardPodReach;
use crate::apis::ClusterColocationProfile;

pub fn validators() -> Vec<Box<dyn Validator<ClusterColocationProfile>>> {
    vec![Box::new(GuardPodReach)]
}
