//! Ours, beyond Koordinator: a node's amplification ratios must be a JSON object of resource name to
//! number, each between 1 and `--max-amplification-ratio`. Checked on CREATE, and on UPDATE when the
//! annotation changed; removing it is always accepted.

use crate::memory::metered::read_within;
use std::collections::BTreeMap;

use super::object::Node;
use kube::core::admission::Operation;

use crate::admission::chain::{Ctx, Step, Validator};
use crate::admission::outcome::Rejection;
use crate::apis::keys::AMPLIFICATION_RATIO;

pub struct AmplificationBounds;

impl Validator<Node> for AmplificationBounds {
    fn name(&self) -> &'static str {
        "NodeAmplificationBounds"
    }

    fn validate<'a>(&'a self, ctx: &'a Ctx<'a, Node>) -> Step<'a> {
        let ratio = |n: Option<&Node>| {
            n.and_then(|n| n.metadata.annotations.as_ref())
                .and_then(|a| a.get(AMPLIFICATION_RATIO))
                .cloned()
        };
        let new = ratio(ctx.object());
        let check = match ctx.operation() {
            Operation::Create => true,
            Operation::Update => new != ratio(ctx.old_object()),
            _ => false,
        };
        match new.filter(|_| check) {
            Some(text) => check_ratios(&text, ctx.settings.max_amplification_ratio)
                .map_err(Rejection::invalid)
                .into(),
            None => Ok(()).into(),
        }
    }
}

pub fn check_ratios(text: &str, max: f64) -> Result<(), String> {
    let ratios: BTreeMap<String, f64> = read_within(text.as_bytes()).map_err(|_| {
        format!(
            "{AMPLIFICATION_RATIO}: Invalid value: {text:?}: must be a JSON object of resource name to number"
        )
    })?;
    match ratios.iter().find(|(_, r)| !(**r >= 1.0 && **r <= max)) {
        Some((resource, ratio)) => Err(format!(
            "{AMPLIFICATION_RATIO}: Invalid value: \"{resource}={ratio}\": must be between 1 and {max}"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_and_bounds() {
        assert_eq!(check_ratios(r#"{"cpu": 1.5, "memory": 1}"#, 5.0), Ok(()));
        assert_eq!(check_ratios("{}", 5.0), Ok(()));
        assert_eq!(
            check_ratios(r#"{"cpu": "2"}"#, 5.0).unwrap_err(),
            r#"node.koordinator.sh/resource-amplification-ratio: Invalid value: "{\"cpu\": \"2\"}": must be a JSON object of resource name to number"#
        );
        assert_eq!(
            check_ratios(r#"{"cpu": 6, "memory": 0.5}"#, 5.0).unwrap_err(),
            r#"node.koordinator.sh/resource-amplification-ratio: Invalid value: "cpu=6": must be between 1 and 5"#
        );
        assert_eq!(
            check_ratios(r#"{"memory": 0.5}"#, 2.5).unwrap_err(),
            r#"node.koordinator.sh/resource-amplification-ratio: Invalid value: "memory=0.5": must be between 1 and 2.5"#
        );
    }
}
