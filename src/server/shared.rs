//! What the admission server's handlers share: the process state, the admission framework and the
//! server's own budgets. A leaf of `server/`: the handlers and the builder take it from here.

use std::sync::Arc;

use super::limits::{BodyBudget, DecodeBudget, Limits};
use crate::admission::Admission;
use crate::state::State;

/// What the request handlers share: the process state, and the admission server's own parts.
pub struct Shared {
    pub state: Arc<State>,
    pub admission: Admission,
    pub limits: Limits,
    pub(super) body_budget: BodyBudget,
    pub(super) decode_budget: DecodeBudget,
    /// PEM of the CAs whose client certificates are required (`--client-ca-file`); none: no
    /// client authentication.
    pub client_ca: Option<Arc<crate::tls::ClientCa>>,
}

impl Shared {
    /// `admission` built over `state`'s cache and metrics (as `serve` builds it).
    pub fn new(state: Arc<State>, admission: Admission, limits: Limits) -> Self {
        Self {
            state,
            admission,
            body_budget: BodyBudget::new(limits.max_inflight_bytes, limits.address_share()),
            decode_budget: DecodeBudget::new(limits.decode_budget),
            limits,
            client_ca: None,
        }
    }

    /// Requires client certificates signed by these CAs on the admission port.
    pub fn with_client_ca(mut self, client_ca: Option<Arc<crate::tls::ClientCa>>) -> Self {
        self.client_ca = client_ca;
        self
    }
}
