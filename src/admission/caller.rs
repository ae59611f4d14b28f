//! Who sent the review being answered: the peer's address, for what one replica shares between
//! callers. The quota ledger writes each caller's oldest change first, in turn, so one caller's
//! many reviews (a forger's) cannot keep another's (the API server's) from being recorded.
//!
//! Set by the server around each review as a task-local: it rides with the review's future (the
//! chain runs on the request's task) without threading an address through every rule's
//! signature. Absent in `review`, `serve --state` tests and fuzzing: one caller then.

use std::future::Future;
use std::net::IpAddr;

tokio::task_local! {
    static CALLER: IpAddr;
}

/// Runs `review` as sent by `caller`.
pub async fn answering_for<F: Future>(caller: Option<IpAddr>, review: F) -> F::Output {
    match caller {
        Some(ip) => CALLER.scope(ip, review).await,
        None => review.await,
    }
}

/// The caller of the review this task answers, if the server said.
pub fn current() -> Option<IpAddr> {
    CALLER.try_with(|ip| *ip).ok()
}
