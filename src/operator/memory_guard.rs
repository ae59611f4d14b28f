//! A replica that knows its container's memory limit (`--memory-limit`, from the Downward API in
//! both installs) watches its own resident memory and, near the limit, says so before the kernel
//! kills it: it turns unready (the Service stops sending it reviews, which are what grows memory
//! fastest) and records a Warning Event `MemoryNearLimit` on its Pod naming the figures and what to
//! change. Below a lower mark it is ready again (a Normal `MemoryBelowLimit` Event).
//!
//! It does not drop objects from its cache to stay under the limit: answers from a partial cache
//! would be wrong answers (a quota or profile missing is a pod admitted unchecked), where an
//! unready replica is one the API server does not call. The cure is the limit (the README's sizing
//! table), which the Event names.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{EventType, Recorder};

use crate::kube_events::{self, Note};
use crate::state::State;

/// Unready above this share of the limit...
const HIGH: f64 = 0.85;
/// ...and ready again below this one (apart, so a replica near the mark does not flap).
const LOW: f64 = 0.75;
const EVERY: Duration = Duration::from_secs(5);
const CHECK: &str = "memory";

/// What a reading of resident memory changes.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    None,
    Over,
    Under,
}

/// The guard's state: whether the replica is over its mark.
#[derive(Debug, Default)]
pub struct Mark {
    over: bool,
}

impl Mark {
    pub fn observe(&mut self, resident: u64, limit: u64) -> Change {
        let share = resident as f64 / limit as f64;
        match (self.over, share) {
            (false, s) if s > HIGH => {
                self.over = true;
                Change::Over
            }
            (true, s) if s < LOW => {
                self.over = false;
                Change::Under
            }
            _ => Change::None,
        }
    }
}

/// This process's resident memory (VmRSS), in bytes.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn mib(bytes: u64) -> u64 {
    bytes / (1024 * 1024)
}

/// Runs until the process ends; `pod` is the replica's own Pod (the Events' object).
pub async fn run(
    limit: u64,
    state: std::sync::Arc<State>,
    recorder: Recorder,
    pod: ObjectReference,
) {
    let mut mark = Mark::default();
    loop {
        tokio::time::sleep(EVERY).await;
        let Some(resident) = resident_bytes() else {
            return;
        };
        let (kind, reason, note) = match mark.observe(resident, limit) {
            Change::None => continue,
            Change::Over => {
                let note = format!(
                    "resident memory {} MiB is over {:.0} % of the memory limit {} MiB: unready until \
                     it is below {:.0} %; raise resources.limits.memory (README, Sizing)",
                    mib(resident),
                    HIGH * 100.0,
                    mib(limit),
                    LOW * 100.0
                );
                tracing::warn!(resident, limit, "{note}");
                state.readiness.set_not_ready(CHECK, note.clone());
                (EventType::Warning, "MemoryNearLimit", note)
            }
            Change::Under => {
                let note = format!(
                    "resident memory {} MiB is below {:.0} % of the memory limit {} MiB again",
                    mib(resident),
                    LOW * 100.0,
                    mib(limit)
                );
                tracing::info!(resident, limit, "{note}");
                state.readiness.set_ready(CHECK);
                (EventType::Normal, "MemoryBelowLimit", note)
            }
        };
        let note = Note {
            type_: kind,
            reason,
            action: "CheckMemory",
            note,
        };
        kube_events::record(&recorder, &pod, note).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_the_high_mark_then_under_the_low_one() {
        let mut m = Mark::default();
        let limit = 1000;
        assert_eq!(m.observe(800, limit), Change::None);
        assert_eq!(m.observe(860, limit), Change::Over);
        // Between the marks: still over, nothing new.
        assert_eq!(m.observe(900, limit), Change::None);
        assert_eq!(m.observe(800, limit), Change::None);
        assert_eq!(m.observe(740, limit), Change::Under);
        assert_eq!(m.observe(800, limit), Change::None);
    }

    #[test]
    fn reads_its_own_memory() {
        assert!(resident_bytes().unwrap() > 0);
    }
}
