//! Kubernetes' `utilerrors.Aggregate` text, which Koordinator's messages carry: one error as it is,
//! several in brackets, a message repeated only once.

pub fn aggregate(errors: Vec<String>) -> Option<String> {
    let mut unique: Vec<String> = Vec::with_capacity(errors.len());
    for e in errors {
        if !unique.contains(&e) {
            unique.push(e);
        }
    }
    match unique.len() {
        0 => None,
        1 => unique.pop(),
        _ => Some(format!("[{}]", unique.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::aggregate;

    #[test]
    fn one_as_is_several_in_brackets_repeats_once() {
        assert_eq!(aggregate(vec![]), None);
        assert_eq!(aggregate(vec!["a".into()]).as_deref(), Some("a"));
        assert_eq!(
            aggregate(vec!["a".into(), "a".into()]).as_deref(),
            Some("a")
        );
        assert_eq!(
            aggregate(vec!["a".into(), "b".into(), "a".into()]).as_deref(),
            Some("[a, b]")
        );
    }
}
