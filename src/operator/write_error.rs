//! Why a leader-only write of the operator did not happen: the API call failed, or the fence found
//! this replica no longer the leader (then nothing is written).

use super::leader::NotLeader;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("kubernetes API: {0}")]
    Api(#[from] kube::Error),
    #[error(transparent)]
    NotLeader(#[from] NotLeader),
}
