//! What an entry is called for: every request, only those meeting named CEL conditions, or none.

use k8s_openapi::api::admissionregistration::v1::MatchCondition;

/// What an entry is called for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Calls {
    /// Every request its rules and selectors match.
    All,
    /// Only requests meeting every condition (the API server ANDs them).
    When(Vec<Condition>),
    /// None: the entry is left out.
    Never,
}

/// One named CEL expression; a request is sent when it is true.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Condition {
    pub name: &'static str,
    pub expression: String,
}

impl Condition {
    pub fn to_match_condition(&self) -> MatchCondition {
        MatchCondition {
            name: self.name.to_owned(),
            expression: self.expression.clone(),
        }
    }
}

impl Calls {
    /// The entry's `matchConditions` (`None` when it is sent every request).
    pub fn match_conditions(&self) -> Option<Vec<MatchCondition>> {
        match self {
            Calls::When(conditions) => Some(
                conditions
                    .iter()
                    .map(Condition::to_match_condition)
                    .collect(),
            ),
            Calls::All | Calls::Never => None,
        }
    }
}
