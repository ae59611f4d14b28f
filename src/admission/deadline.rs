//! When a review's answer is due. A leaf: the chain checks it between plugins, the endpoint sets it
//! from the request.

use std::time::Duration;

/// The API server's own default when a request names no `?timeout=`.
pub const DEFAULT_API_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest `timeoutSeconds` the API server accepts for a webhook: a larger `?timeout=` can only
/// come from another caller, and is cut to it (an instant that far ahead would overflow).
pub const MAX_API_TIMEOUT: Duration = Duration::from_secs(30);

/// When a review's answer is due: the API server's `?timeout=` (or its default) counted from when
/// the request arrived, less a margin for the answer to travel back. Decoding and every plugin
/// spend from it: work that cannot be preempted (a large decode, a synchronous rule) is checked
/// after decode and between plugins, so a review answers by the deadline plus one plugin's time at
/// most, not by the deadline plus everything after it.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    pub(super) api_timeout: Duration,
    pub(super) budget: Duration,
    at: tokio::time::Instant,
}

impl Deadline {
    /// The deadline of a request that arrived at `received`.
    pub fn from(received: tokio::time::Instant, api_timeout: Option<Duration>) -> Self {
        let api_timeout = api_timeout
            .unwrap_or(DEFAULT_API_TIMEOUT)
            .min(MAX_API_TIMEOUT);
        let budget = answer_budget(api_timeout);
        Self {
            api_timeout,
            budget,
            at: received + budget,
        }
    }

    /// The deadline of a request arriving now.
    pub fn starting_now(api_timeout: Option<Duration>) -> Self {
        Self::from(tokio::time::Instant::now(), api_timeout)
    }

    pub fn instant(&self) -> tokio::time::Instant {
        self.at
    }

    pub fn passed(&self) -> bool {
        tokio::time::Instant::now() >= self.at
    }
}

/// The time a chain may take: the API server's timeout less a margin for the answer to travel back.
pub fn answer_budget(api_timeout: Duration) -> Duration {
    let margin = (api_timeout / 10).max(Duration::from_millis(100));
    api_timeout
        .saturating_sub(margin)
        .max(Duration::from_millis(50))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_past_what_the_api_server_allows_is_cut_to_it() {
        let huge = crate::duration::parse_duration("18000000000000000000s").unwrap();
        let deadline = Deadline::starting_now(Some(huge));
        assert_eq!(deadline.api_timeout, MAX_API_TIMEOUT);
        assert!(deadline.at <= tokio::time::Instant::now() + MAX_API_TIMEOUT);
    }
}
