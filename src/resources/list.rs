//! Resource lists (name -> quantity) with the comparisons quota rules use.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity::{Qty, QuantityError};

/// A parsed resource list, sorted by name.
///
/// A sorted vector, not a `BTreeMap`: lists hold two to five names, and a map's node reserves room
/// for eleven (about 640 bytes whatever the count). The quota tree keeps three lists per quota, the
/// cache 10,000 quotas at the size Koordinator runs (docs/scale.md).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources(Vec<(String, Qty)>);

impl Resources {
    pub fn parse(list: Option<&BTreeMap<String, Quantity>>) -> Result<Self, QuantityError> {
        // A BTreeMap iterates in name order: the vector is sorted as built.
        let list = list.into_iter().flatten();
        let mut out = Vec::with_capacity(list.size_hint().0);
        for (name, q) in list {
            out.push((name.clone(), Qty::try_from(q)?));
        }
        Ok(Self(out))
    }

    /// Parses a JSON resource list (the annotation format); `null` is an empty list, as in Go. Read
    /// under a meter of the text's own allowance: an annotation is part of a review, and its tree
    /// is not in the review's decode budget.
    pub fn parse_json(text: &str) -> Result<Self, String> {
        let raw: Option<BTreeMap<String, Quantity>> =
            crate::memory::metered::read_within(text.as_bytes()).map_err(|e| e.to_string())?;
        Self::parse(raw.as_ref()).map_err(|e| e.to_string())
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(name))
    }

    /// The value of `name`, if the list has it.
    pub fn value(&self, name: &str) -> Option<Qty> {
        self.position(name).ok().map(|i| self.0[i].1)
    }

    /// The value of `name`; a missing name reads as 0.
    pub fn get(&self, name: &str) -> Qty {
        self.value(name).unwrap_or_default()
    }

    /// Sets `name` to `q`, keeping the list sorted.
    pub fn insert(&mut self, name: &str, q: Qty) {
        match self.position(name) {
            Ok(i) => self.0[i].1 = q,
            Err(i) => self.0.insert(i, (name.to_owned(), q)),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.position(name).is_ok()
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(k, _)| k)
    }

    /// Names and values, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Qty)> {
        self.0.iter().map(|(k, q)| (k, q))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Names whose value is negative, sorted.
    pub fn negative_keys(&self) -> Vec<&str> {
        self.iter()
            .filter(|(_, q)| q.is_negative())
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// Adds `other` key by key.
    pub fn add(&mut self, other: &Resources) {
        self.merge(other, Qty::plus, |q| q);
    }

    /// Subtracts `other` key by key.
    pub fn sub(&mut self, other: &Resources) {
        self.merge(other, Qty::minus, |q| Qty::default().minus(q));
    }

    /// Drops zero values: a running sum then equals one computed from scratch, whatever the order
    /// of additions and subtractions (a missing key already reads as 0).
    pub fn without_zeros(mut self) -> Self {
        self.0.retain(|(_, q)| !q.is_zero());
        self
    }

    /// Keeps the larger value per key.
    pub fn max_with(&mut self, other: &Resources) {
        self.merge(other, Qty::max, |q| q);
    }

    /// Combines `other` into `self` in one pass over both sorted lists: `both` where a name is in
    /// both, `only_other` where it is only in `other`. Linear: a key inserted one at a time cost a
    /// shift of the vector each, and a pod of two containers with 20,000 resource names each took
    /// a worker for 10 s (the attack review).
    fn merge(
        &mut self,
        other: &Resources,
        both: impl Fn(Qty, Qty) -> Qty,
        only_other: impl Fn(Qty) -> Qty,
    ) {
        if other.0.is_empty() {
            return;
        }
        // The common case on the request path (a pod's containers naming the same few
        // resources): every name already here, combined in place without a new vector.
        if other.0.iter().all(|(name, _)| self.position(name).is_ok()) {
            for (name, q) in &other.0 {
                if let Ok(i) = self.position(name) {
                    self.0[i].1 = both(self.0[i].1, *q);
                }
            }
            return;
        }
        let mine = std::mem::take(&mut self.0);
        let mut out = Vec::with_capacity(mine.len() + other.0.len());
        let mut mine = mine.into_iter().peekable();
        let mut theirs = other.0.iter().peekable();
        loop {
            let order = match (mine.peek(), theirs.peek()) {
                (Some((a, _)), Some((b, _))) => a.as_str().cmp(b.as_str()),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => break,
            };
            match order {
                std::cmp::Ordering::Less => out.extend(mine.next()),
                std::cmp::Ordering::Greater => {
                    if let Some((name, q)) = theirs.next() {
                        out.push((name.clone(), only_other(*q)));
                    }
                }
                std::cmp::Ordering::Equal => {
                    if let (Some((name, a)), Some((_, b))) = (mine.next(), theirs.next()) {
                        out.push((name, both(a, *b)));
                    }
                }
            }
        }
        self.0 = out;
    }

    /// Every key of `self` is at most `other`'s value, a missing key in `other` counting as 0.
    pub fn le_completely(&self, other: &Resources) -> bool {
        self.iter().all(|(name, q)| *q <= other.get(name))
    }

    pub fn to_quantities(&self) -> BTreeMap<String, Quantity> {
        self.iter()
            .map(|(k, q)| (k.clone(), q.to_quantity()))
            .collect()
    }

    /// `k=v` pairs joined by `,`, keys sorted.
    pub fn describe(&self) -> String {
        self.iter()
            .map(|(k, q)| format!("{k}={q}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Later values of a repeated name win, as in a map.
impl FromIterator<(String, Qty)> for Resources {
    fn from_iter<I: IntoIterator<Item = (String, Qty)>>(iter: I) -> Self {
        let mut list: Vec<(String, Qty)> = iter.into_iter().collect();
        // Stable: equal names keep their order, and the last of each run is kept.
        list.sort_by(|a, b| a.0.cmp(&b.0));
        list.reverse();
        list.dedup_by(|later, earlier| later.0 == earlier.0);
        list.reverse();
        Self(list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn qty(text: &str) -> Qty {
        Qty::try_from(&Quantity(text.to_owned())).unwrap()
    }

    /// A few names, so that sequences repeat them.
    fn op() -> impl Strategy<Value = (u8, String, i64)> {
        (0u8..4, "[a-d]", -3i64..4)
    }

    proptest! {
        /// The sorted vector answers as a map of name -> quantity would, after any sequence of
        /// additions, subtractions, maxima and collections.
        #[test]
        fn answers_as_a_map_does(ops in prop::collection::vec(op(), 0..40)) {
            let mut list = Resources::default();
            let mut model: BTreeMap<String, i128> = BTreeMap::new();
            for (kind, name, n) in ops {
                let one = Resources::from_iter([(name.clone(), qty(&n.to_string()))]);
                match kind {
                    0 => {
                        list.add(&one);
                        *model.entry(name).or_default() += i128::from(n) * 1000;
                    }
                    1 => {
                        list.sub(&one);
                        *model.entry(name).or_default() -= i128::from(n) * 1000;
                    }
                    2 => {
                        list.max_with(&one);
                        let v = model.entry(name).or_insert(i128::from(n) * 1000);
                        *v = (*v).max(i128::from(n) * 1000);
                    }
                    _ => {
                        // Collecting a repeated name keeps its last value.
                        list = list
                            .iter()
                            .map(|(k, q)| (k.clone(), *q))
                            .chain([(name.clone(), qty("7")), (name.clone(), qty(&n.to_string()))])
                            .collect();
                        model.insert(name, i128::from(n) * 1000);
                    }
                }
                let seen: Vec<(String, i128)> =
                    list.iter().map(|(k, q)| (k.clone(), q.milli())).collect();
                let want: Vec<(String, i128)> = model.clone().into_iter().collect();
                prop_assert_eq!(seen, want);
            }
        }
    }
}
