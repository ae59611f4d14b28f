//! Resource lists (name -> quantity) with the comparisons quota rules use.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity::{Qty, QuantityError};

/// A parsed resource list, sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources(pub BTreeMap<String, Qty>);

impl Resources {
    pub fn parse(list: Option<&BTreeMap<String, Quantity>>) -> Result<Self, QuantityError> {
        let mut out = BTreeMap::new();
        for (name, q) in list.into_iter().flatten() {
            out.insert(name.clone(), Qty::try_from(q)?);
        }
        Ok(Self(out))
    }

    /// Parses a JSON resource list (the annotation format); `null` is an empty list, as in Go.
    pub fn parse_json(text: &str) -> Result<Self, String> {
        let raw: Option<BTreeMap<String, Quantity>> =
            serde_json::from_str(text).map_err(|e| e.to_string())?;
        Self::parse(raw.as_ref()).map_err(|e| e.to_string())
    }

    pub fn get(&self, name: &str) -> Qty {
        self.0.get(name).copied().unwrap_or_default()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.keys()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Names whose value is negative, sorted.
    pub fn negative_keys(&self) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(_, q)| q.is_negative())
            .map(|(k, _)| k.as_str())
            .collect()
    }

    /// Adds `other` key by key.
    pub fn add(&mut self, other: &Resources) {
        for (name, q) in &other.0 {
            let sum = self.0.get(name).map_or(*q, |mine| mine.plus(*q));
            self.0.insert(name.clone(), sum);
        }
    }

    /// Subtracts `other` key by key.
    pub fn sub(&mut self, other: &Resources) {
        for (name, q) in &other.0 {
            let diff = self.get(name).minus(*q);
            self.0.insert(name.clone(), diff);
        }
    }

    /// Drops zero values: a running sum then equals one computed from scratch, whatever the order
    /// of additions and subtractions (a missing key already reads as 0).
    pub fn without_zeros(mut self) -> Self {
        self.0.retain(|_, q| !q.is_zero());
        self
    }

    /// Keeps the larger value per key.
    pub fn max_with(&mut self, other: &Resources) {
        for (name, q) in &other.0 {
            let larger = self.0.get(name).map_or(*q, |mine| (*mine).max(*q));
            self.0.insert(name.clone(), larger);
        }
    }

    /// Every key of `self` is at most `other`'s value, a missing key in `other` counting as 0.
    pub fn le_completely(&self, other: &Resources) -> bool {
        self.0.iter().all(|(name, q)| *q <= other.get(name))
    }

    pub fn to_quantities(&self) -> BTreeMap<String, Quantity> {
        self.0
            .iter()
            .map(|(k, q)| (k.clone(), q.to_quantity()))
            .collect()
    }

    /// `k=v` pairs joined by `,`, keys sorted.
    pub fn describe(&self) -> String {
        self.0
            .iter()
            .map(|(k, q)| format!("{k}={q}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl FromIterator<(String, Qty)> for Resources {
    fn from_iter<I: IntoIterator<Item = (String, Qty)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}
