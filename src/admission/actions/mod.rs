//! What a rule's finding does, per rule (`--rule-action RULE=ACTIONS`), in ValidatingAdmissionPolicy's
//! words. Enforced, as Koordinator does: a validating rule's refusal denies (`Deny`), a mutating
//! rule's change is patched (`Apply`). Shadowed, to try a rule before it enforces: the refusal is
//! shown to the client (`Warn`) and/or recorded in the API server's audit log (`Audit`), the change
//! is computed and recorded but not sent (`Audit`), and the rule runs as on a dry-run request, so it
//! writes nothing (docs/admission.md, "Trying a rule before it enforces").

use std::collections::BTreeMap;

use crate::entries::WebhookKind;

/// One rule's action: a set of Deny/Apply, Warn and Audit (which sets fit which rule: `parse`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Action {
    enforce: bool,
    warn: bool,
    audit: bool,
}

impl Action {
    /// Koordinator's behaviour and every rule's default.
    pub const ENFORCE: Action = Action {
        enforce: true,
        warn: false,
        audit: false,
    };

    /// Record, do not enforce: what Audit is for a rule of either kind.
    pub const AUDIT: Action = Action {
        enforce: false,
        warn: false,
        audit: true,
    };

    /// The refusal denies, the change is patched.
    pub fn enforces(self) -> bool {
        self.enforce
    }

    /// A refusal is returned to the client as a warning.
    pub fn warns(self) -> bool {
        self.warn
    }

    /// A refusal (or a change not sent) is recorded in an audit annotation.
    pub fn audits(self) -> bool {
        self.audit
    }

    /// The action as the flag and the metrics write it for a rule of `kind`.
    pub fn label(self, kind: WebhookKind) -> &'static str {
        match (kind, self.enforce, self.warn, self.audit) {
            (WebhookKind::Mutating, true, _, _) => "Apply",
            (WebhookKind::Mutating, false, _, _) => "Audit",
            (WebhookKind::Validating, true, _, true) => "Deny+Audit",
            (WebhookKind::Validating, true, _, false) => "Deny",
            (WebhookKind::Validating, false, true, true) => "Warn+Audit",
            (WebhookKind::Validating, false, true, false) => "Warn",
            (WebhookKind::Validating, false, false, _) => "Audit",
        }
    }
}

/// A registered rule, as `--rule-action` names it (the plugin's name, also in the metrics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub name: &'static str,
    pub kind: WebhookKind,
    /// Whether its finding may be shown or recorded instead of enforced. Rules that keep the
    /// webhook itself safe (the pod-reach guard) may not.
    pub shadowable: bool,
    /// The paths that run it.
    pub webhooks: Vec<&'static str>,
}

/// The words of one `--rule-action` value, before they are checked against the rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Words {
    deny: bool,
    apply: bool,
    warn: bool,
    audit: bool,
}

/// Why a `--rule-action` cannot be taken.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    #[error(
        "{0:?}: expected RULE=ACTIONS, ACTIONS one or more of Deny, Warn, Audit, Apply joined by +"
    )]
    Shape(String),
    #[error("{word:?} is not an action (Deny, Warn, Audit, Apply)")]
    Word { word: String },
    #[error("no rule is named {name:?}; the rules: {known}")]
    UnknownRule { name: String, known: String },
    #[error("{rule} is a mutating rule: its action is Apply or Audit, not {given}")]
    Mutating { rule: &'static str, given: String },
    #[error(
        "{rule} is a validating rule: its action is Deny, Warn or Audit (Deny or Warn with Audit), not {given}"
    )]
    Validating { rule: &'static str, given: String },
    #[error(
        "{rule} keeps the webhook itself safe and cannot be shadowed: its action stays {enforce}"
    )]
    NotShadowable {
        rule: &'static str,
        enforce: &'static str,
    },
}

impl Rule {
    /// The action `words` give this rule, if they fit it.
    fn action(&self, words: Words, given: &str) -> Result<Action, ActionError> {
        let action = Action {
            enforce: words.deny || words.apply,
            warn: words.warn,
            audit: words.audit,
        };
        let fits = match self.kind {
            WebhookKind::Mutating => !words.deny && !words.warn && (words.apply != words.audit),
            WebhookKind::Validating => !(words.apply || words.deny && words.warn),
        };
        if !fits {
            let given = given.to_owned();
            return Err(match self.kind {
                WebhookKind::Mutating => ActionError::Mutating {
                    rule: self.name,
                    given,
                },
                WebhookKind::Validating => ActionError::Validating {
                    rule: self.name,
                    given,
                },
            });
        }
        if !self.shadowable && !action.enforce {
            return Err(ActionError::NotShadowable {
                rule: self.name,
                enforce: Action::ENFORCE.label(self.kind),
            });
        }
        Ok(action)
    }
}

/// Every rule's action: [`Action::ENFORCE`] unless a `--rule-action` names it or an
/// `--entry-action` puts its endpoint in Audit (the rule's own action wins).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleActions {
    rules: BTreeMap<&'static str, Action>,
    /// By endpoint path and rule: the shadowable rules of endpoints in Audit.
    endpoints: BTreeMap<(&'static str, &'static str), Action>,
}

/// What Audit is for a rule of either kind: record, do not enforce.
const AUDIT: Action = Action::AUDIT;

impl RuleActions {
    /// The action of the rule `name` on the endpoint `webhook`.
    pub fn of(&self, webhook: &str, name: &str) -> Action {
        // Most installs set none: no lookup on the request path then.
        if self.rules.is_empty() && self.endpoints.is_empty() {
            return Action::ENFORCE;
        }
        self.rules
            .get(name)
            .or_else(|| self.endpoints.get(&(webhook, name)))
            .copied()
            .unwrap_or(Action::ENFORCE)
    }

    /// Every shadowable validating rule in Audit (`audit` asks what would be refused).
    pub fn auditing(rules: &[Rule]) -> Self {
        Self {
            rules: rules
                .iter()
                .filter(|r| r.shadowable && r.kind == WebhookKind::Validating)
                .map(|r| (r.name, AUDIT))
                .collect(),
            endpoints: BTreeMap::new(),
        }
    }

    /// Builds the table from parsed `--rule-action` values; the last naming a rule wins.
    pub fn from_parsed(values: &[(&'static str, Action)]) -> Self {
        Self {
            rules: values.iter().copied().collect(),
            endpoints: BTreeMap::new(),
        }
    }

    /// With every shadowable rule of the endpoints at `paths` in Audit (`--entry-action`).
    pub fn with_audited_endpoints(mut self, paths: &[&str], rules: &[Rule]) -> Self {
        for rule in rules.iter().filter(|r| r.shadowable) {
            for webhook in rule.webhooks.iter().filter(|w| paths.contains(w)) {
                self.endpoints.insert((webhook, rule.name), AUDIT);
            }
        }
        self
    }
}

/// Parses `RULE=ACTIONS` against the registered `rules`.
pub fn parse(text: &str, rules: &[Rule]) -> Result<(&'static str, Action), ActionError> {
    let (name, given) = text
        .split_once('=')
        .filter(|(name, given)| !name.is_empty() && !given.is_empty())
        .ok_or_else(|| ActionError::Shape(text.to_owned()))?;
    let mut words = Words::default();
    for word in given.split('+') {
        let slot = match word.trim() {
            "Deny" => &mut words.deny,
            "Apply" => &mut words.apply,
            "Warn" => &mut words.warn,
            "Audit" => &mut words.audit,
            other => {
                return Err(ActionError::Word {
                    word: other.to_owned(),
                });
            }
        };
        *slot = true;
    }
    let rule = rules
        .iter()
        .find(|r| r.name == name)
        .ok_or_else(|| ActionError::UnknownRule {
            name: name.to_owned(),
            known: rules.iter().map(|r| r.name).collect::<Vec<_>>().join(", "),
        })?;
    Ok((rule.name, rule.action(words, given)?))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod parse_tests {
    use super::*;

    fn rule(name: &'static str, kind: WebhookKind, shadowable: bool) -> Rule {
        Rule {
            name,
            kind,
            shadowable,
            webhooks: vec!["/x"],
        }
    }

    fn rules() -> Vec<Rule> {
        vec![
            rule("V", WebhookKind::Validating, true),
            rule("M", WebhookKind::Mutating, true),
            rule("Guard", WebhookKind::Validating, false),
        ]
    }

    #[test]
    fn validating_rules_take_deny_warn_audit_but_not_deny_with_warn() {
        let rules = rules();
        for (given, label) in [
            ("Deny", "Deny"),
            ("Warn", "Warn"),
            ("Audit", "Audit"),
            ("Warn+Audit", "Warn+Audit"),
            ("Audit+Warn", "Warn+Audit"),
            ("Deny+Audit", "Deny+Audit"),
        ] {
            let (name, action) = parse(&format!("V={given}"), &rules).unwrap();
            assert_eq!(name, "V");
            assert_eq!(action.label(WebhookKind::Validating), label, "{given}");
            assert_eq!(action.enforces(), given.contains("Deny"), "{given}");
        }
        for given in ["Deny+Warn", "Apply", "Warn+Apply"] {
            assert!(
                matches!(
                    parse(&format!("V={given}"), &rules),
                    Err(ActionError::Validating { .. })
                ),
                "{given}"
            );
        }
    }

    #[test]
    fn mutating_rules_take_apply_or_audit_only() {
        let rules = rules();
        assert_eq!(parse("M=Apply", &rules).unwrap().1, Action::ENFORCE);
        let (_, audit) = parse("M=Audit", &rules).unwrap();
        assert!(!audit.enforces() && audit.audits());
        assert_eq!(audit.label(WebhookKind::Mutating), "Audit");
        for given in ["Deny", "Warn", "Apply+Audit", "Warn+Audit"] {
            assert!(
                matches!(
                    parse(&format!("M={given}"), &rules),
                    Err(ActionError::Mutating { .. })
                ),
                "{given}"
            );
        }
    }

    #[test]
    fn a_rule_that_keeps_the_webhook_safe_only_enforces() {
        let rules = rules();
        assert!(parse("Guard=Deny", &rules).is_ok());
        assert!(parse("Guard=Deny+Audit", &rules).is_ok());
        for given in ["Warn", "Audit", "Warn+Audit"] {
            assert_eq!(
                parse(&format!("Guard={given}"), &rules),
                Err(ActionError::NotShadowable {
                    rule: "Guard",
                    enforce: "Deny"
                })
            );
        }
    }

    #[test]
    fn malformed_values_and_unknown_rules_say_what_is_wrong() {
        let rules = rules();
        assert!(matches!(parse("V", &rules), Err(ActionError::Shape(_))));
        assert!(matches!(parse("=Warn", &rules), Err(ActionError::Shape(_))));
        assert!(matches!(parse("V=", &rules), Err(ActionError::Shape(_))));
        assert_eq!(
            parse("V=warn", &rules),
            Err(ActionError::Word {
                word: "warn".into()
            })
        );
        let unknown = parse("Nope=Warn", &rules).unwrap_err();
        assert!(unknown.to_string().contains("V, M, Guard"), "{unknown}");
    }

    #[test]
    fn unnamed_rules_enforce_and_the_last_value_wins() {
        let rules = rules();
        let values = [
            parse("V=Warn", &rules).unwrap(),
            parse("V=Audit", &rules).unwrap(),
        ];
        let actions = RuleActions::from_parsed(&values);
        assert_eq!(
            actions.of("/x", "V").label(WebhookKind::Validating),
            "Audit"
        );
        assert_eq!(actions.of("/x", "M"), Action::ENFORCE);
        assert_eq!(RuleActions::default().of("/x", "V"), Action::ENFORCE);
    }

    #[test]
    fn an_audited_endpoint_shadows_its_shadowable_rules_there_only() {
        let mut rules = rules();
        rules[0].webhooks = vec!["/a", "/b"];
        rules[2].webhooks = vec!["/a"];
        let warned = [parse("M=Audit", &rules).unwrap()];
        let actions = RuleActions::from_parsed(&warned).with_audited_endpoints(&["/a"], &rules);
        assert!(!actions.of("/a", "V").enforces());
        assert!(actions.of("/b", "V").enforces(), "another endpoint's run");
        assert!(actions.of("/a", "Guard").enforces(), "not shadowable");
        assert!(!actions.of("/x", "M").enforces(), "the rule's own action");
    }
}
