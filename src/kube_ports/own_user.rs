//! Who the replica is to the API server: a SelfSubjectReview (authentication.k8s.io/v1, allowed
//! to every authenticated user) gives the user name its requests carry, which
//! `elastic_quota/own_annotations.rs` compares a quota's writer with. Asked once at start and
//! again, with a growing pause, until the API server answers.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};

use crate::admission::settings::OwnUser;

/// The longest pause between two attempts.
const MAX_PAUSE: Duration = Duration::from_secs(30);

/// Asks until the user name is known, then records it in `own`.
pub async fn learn(client: kube::Client, own: OwnUser) {
    let api = Api::<SelfSubjectReview>::all(client);
    let mut pause = Duration::from_millis(500);
    loop {
        match api
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
        {
            Ok(review) => {
                let user = review.status.and_then(|s| s.user_info?.username);
                match user {
                    Some(name) if !name.is_empty() => {
                        tracing::info!(user = %name, "the API server names this replica's requests");
                        own.learn(name);
                        return;
                    }
                    _ => tracing::warn!("the SelfSubjectReview named no user; asking again"),
                }
            }
            Err(e) => tracing::warn!(
                error = %e,
                "cannot learn this replica's user name (SelfSubjectReview); a quota's recent-admissions record is not checked until it is known"
            ),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}
