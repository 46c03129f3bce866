//! Reporting to the forge: the one PR/MR comment, the commit status and the deployment of an
//! environment (a GitHub Deployment with its statuses; a GitLab environment with a deployment
//! per commit, stopped on removal), sent only when what they would say changed.
//!
//! What to send is decided in [`super::report_plan`]; this file sends it. What was last sent is
//! kept in the environment's `status.forge` (comment id, SHA-256 of the comment text and of
//! the status triple), so an unchanged environment makes no forge call, and a restart finds
//! its comment again instead of making a second one. When the id is not known yet (a status
//! write was lost), the comment is looked up by its hidden marker first.
//!
//! A forge that fails never stops deploying: the caller writes the status anyway and retries
//! the report later.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt;

use super::admission::{Admissions, Asking};
use super::budget::ContentLimits;
use super::client::{ForgeApiError, ForgeClient};
use super::comment;
use super::report_plan::{
    CommentUpdate, PlannedPart, RemovalPlan, ReportPlan, plan_removal, plan_report,
};
use super::template_client::{ForgeCallError, TemplateClients};
use crate::model::crd::{
    ForgeReport, PreviewEnvironment, PreviewEnvironmentStatus, PreviewTemplate,
};
use crate::model::footprint::Prices;

pub struct Reporter {
    clients: Arc<TemplateClients>,
    /// What was sent, by environment UID. The controller may reconcile from a cache that does
    /// not show the last status write yet; this record does, so a comment is never created
    /// twice within one process. After a restart the status (read fresh) has it.
    sent: Mutex<HashMap<String, ForgeReport>>,
    /// The operator's prices, for the footprint's cost in the comment (`--price-per-*`).
    prices: Option<Prices>,
    /// The content budget each report must fit in.
    admissions: Admissions,
}

impl Reporter {
    pub fn new(clients: Arc<TemplateClients>) -> Self {
        let metrics = clients.metrics().clone();
        Self {
            clients,
            sent: Mutex::new(HashMap::new()),
            prices: None,
            admissions: Admissions::new(ContentLimits::default(), metrics),
        }
    }

    /// Sends no more content-creating requests per installation, token or instance than
    /// `limits` (`--forge-content-per-minute`, `--forge-content-per-hour`).
    pub fn with_content_limits(self, limits: ContentLimits) -> Self {
        let metrics = self.clients.metrics().clone();
        Self {
            admissions: Admissions::new(limits, metrics),
            ..self
        }
    }

    /// Shows the footprint's cost at `prices` in the comments.
    pub fn with_prices(self, prices: Option<Prices>) -> Self {
        Self { prices, ..self }
    }

    /// The clients the reports go through (shared with the sweep and the repository reader).
    pub fn clients(&self) -> &Arc<TemplateClients> {
        &self.clients
    }

    fn last_sent(&self, uid: &str) -> Option<ForgeReport> {
        self.lock().get(uid).cloned()
    }

    fn remember(&self, uid: String, record: &ForgeReport) {
        self.lock().insert(uid, record.clone());
    }

    /// The records, even if a thread panicked holding them (each is a plain value).
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ForgeReport>> {
        self.sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Brings the forge in line with `status` (the status about to be written). Returns what
    /// was sent as the new `status.forge`; on error, the part that succeeded is in the record
    /// too, so nothing is sent twice.
    pub async fn report(
        &self,
        environment: &PreviewEnvironment,
        template: &PreviewTemplate,
        status: &PreviewEnvironmentStatus,
    ) -> (Option<ForgeReport>, Result<(), ForgeCallError>) {
        let uid = environment.uid().unwrap_or_default();
        let mut record = self
            .last_sent(&uid)
            .or(status.forge.clone())
            .unwrap_or_default();
        let result = self.send(environment, template, status, &mut record).await;
        self.remember(uid, &record);
        let record = (record != ForgeReport::default()).then_some(record);
        (record, result)
    }

    async fn send(
        &self,
        environment: &PreviewEnvironment,
        template: &PreviewTemplate,
        status: &PreviewEnvironmentStatus,
        record: &mut ForgeReport,
    ) -> Result<(), ForgeCallError> {
        let Some((client, budget)) = self.clients.client_with_budget(template).await? else {
            return Ok(());
        };
        let plan = plan_report(environment, template, status, record, self.prices.as_ref());
        let source = &environment.spec.source;
        let parts = plan.parts(template.spec.forge.kind, record, &source.head_sha);
        let uid = environment.uid().unwrap_or_default();
        let asking = Asking {
            environment: &uid,
            repository: &template.spec.forge.repository,
            budget: &budget,
            forge: template.spec.forge.kind,
            phase: Some(status.phase),
        };
        let Some(at) = self.admissions.admit(&asking, parts.clone())? else {
            return Ok(());
        };
        let result = send_plan(&client, environment, &plan, record).await;
        self.settle(&asking, at, &parts, record, result)
    }

    /// After a report admitted `at` went out, or stopped at a failure: counts the requests of
    /// `parts` it spent and gives back the rest ([`spent`]), and a rate-limit answer pauses the
    /// budget (the forge counts content-creating requests on its own, and asks for no more for
    /// a while).
    fn settle(
        &self,
        asking: &Asking,
        at: std::time::Instant,
        parts: &[PlannedPart],
        record: &ForgeReport,
        result: Result<(), ForgeApiError>,
    ) -> Result<(), ForgeCallError> {
        let (sent, unsent) = spent(parts, record, result.is_ok());
        self.admissions.settle(asking, at, &sent, unsent);
        if let Err(ForgeApiError::RateLimited { wait, .. }) = &result {
            self.admissions.pause(asking.budget, *wait);
        }
        Ok(result?)
    }

    /// The environment is gone: the comment says so and the GitHub deployment goes inactive
    /// (GitLab: the environment stops). Returns what was sent as the new `status.forge`, with
    /// `destroyed` set once all of it was (or the forge refused it: asking again would not
    /// help); nothing is sent again after that. The record stays in memory until
    /// [`Reporter::forget`].
    pub async fn report_destroyed(
        &self,
        environment: &PreviewEnvironment,
        template: &PreviewTemplate,
        reason: &str,
    ) -> (ForgeReport, Result<(), ForgeCallError>) {
        let uid = environment.uid().unwrap_or_default();
        let mut record = self
            .last_sent(&uid)
            .or(environment.status.as_ref().and_then(|s| s.forge.clone()))
            .unwrap_or_default();
        let plan = plan_removal(environment, template, reason, &record);
        if plan == RemovalPlan::default() {
            record.destroyed = true;
            return (record, Ok(()));
        }
        let result = self
            .send_removal(environment, template, &plan, &mut record)
            .await;
        record.destroyed = result
            .as_ref()
            .map_or_else(|e| !e.is_transient(), |()| true);
        self.remember(uid, &record);
        (record, result)
    }

    /// Drops what was sent for a removed environment: the map must not keep every environment
    /// that ever lived.
    pub fn forget(&self, environment: &PreviewEnvironment) {
        let uid = environment.uid().unwrap_or_default();
        self.lock().remove(&uid);
        self.admissions.forget(&uid);
    }

    async fn send_removal(
        &self,
        environment: &PreviewEnvironment,
        template: &PreviewTemplate,
        plan: &RemovalPlan,
        record: &mut ForgeReport,
    ) -> Result<(), ForgeCallError> {
        let Some((client, budget)) = self.clients.client_with_budget(template).await? else {
            return Ok(());
        };
        let uid = environment.uid().unwrap_or_default();
        let asking = Asking {
            environment: &uid,
            repository: &template.spec.forge.repository,
            budget: &budget,
            forge: template.spec.forge.kind,
            phase: None,
        };
        let parts = plan.parts();
        let Some(at) = self.admissions.admit(&asking, parts.clone())? else {
            return Ok(());
        };
        let repository = &environment.spec.source.repository;
        let result = send_removal_plan(&client, repository, plan, record).await;
        self.settle(&asking, at, &parts, record, result)
    }
}

/// Which of the requests of `parts` were spent and how many were not, by the record `after`
/// the report: parts go out in order and a report stops at its first failure, so the parts
/// up to the first one not recorded were spent (that one whole: which of its requests reached
/// the forge before the failure is not known, and the forge may have counted the failing
/// one), and the parts after it were never sent. `finished`: the report went out whole (the
/// removal's retirement leaves no mark in the record).
fn spent(parts: &[PlannedPart], after: &ForgeReport, finished: bool) -> (Vec<&'static str>, u32) {
    let recorded = |part: &PlannedPart| match part.part {
        "comment" => after.comment_sha.as_deref() == Some(part.sha.as_str()),
        "waiting" => after.waiting_status_sha.as_deref() == Some(part.sha.as_str()),
        "deploy" => after.status_sha.as_deref() == Some(part.sha.as_str()),
        _ => finished,
    };
    let reached = match parts.iter().position(|part| !finished && !recorded(part)) {
        Some(failed) => failed + 1,
        None => parts.len(),
    };
    let sent = parts[..reached]
        .iter()
        .flat_map(|part| part.requests.iter().copied())
        .collect();
    let unsent = parts[reached..]
        .iter()
        .map(|part| part.requests.len() as u32)
        .sum();
    (sent, unsent)
}

/// Sends `plan` of a live environment, recording each part in `record` as it goes.
async fn send_plan(
    client: &ForgeClient,
    environment: &PreviewEnvironment,
    plan: &ReportPlan,
    record: &mut ForgeReport,
) -> Result<(), ForgeApiError> {
    let repository = &environment.spec.source.repository;
    if let Some(update) = &plan.comment {
        upsert_comment(client, repository, update, record).await?;
    }
    if let Some(update) = &plan.waiting {
        client.commit_status(repository, update).await?;
        record.waiting_status_sha = Some(update.sha.clone());
    }
    if let Some(update) = &plan.deploy {
        client.deploy(environment, update, record).await?;
        client.commit_status(repository, &update.status).await?;
        record.status_sha = Some(update.status.sha.clone());
    }
    Ok(())
}

/// Sends the removal `plan`: the comment says the environment is gone, and the forge's
/// deployment (GitHub) or environment (GitLab) ends.
async fn send_removal_plan(
    client: &ForgeClient,
    repository: &str,
    plan: &RemovalPlan,
    record: &mut ForgeReport,
) -> Result<(), ForgeApiError> {
    if let Some(update) = &plan.comment {
        upsert_comment(client, repository, update, record).await?;
    }
    match &plan.retire {
        Some(retire) => client.retire(repository, retire).await,
        None => Ok(()),
    }
}

/// Edits the environment's comment (found by id, else by marker) or creates it.
async fn upsert_comment(
    client: &ForgeClient,
    repository: &str,
    update: &CommentUpdate,
    record: &mut ForgeReport,
) -> Result<(), ForgeApiError> {
    let (number, text) = (update.number, update.text.as_str());
    let existing = match record.comment_id {
        Some(id) => Some(id),
        None => {
            let marker = comment::marker(&update.environment);
            client.find_comment(repository, number, &marker).await?
        }
    };
    let id = match existing {
        Some(id) => {
            client.edit_comment(repository, number, id, text).await?;
            id
        }
        None => client.create_comment(repository, number, text).await?,
    };
    record.comment_id = Some(id);
    record.comment_sha = Some(update.sha.clone());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::metrics::ForgeMetrics;
    use super::*;
    use crate::cluster::secrets::SecretReader;
    use crate::model::crd::{PreviewEnvironmentSpec, PreviewTemplateSpec};

    /// A reporter that calls no forge and reads no Secret: the template below names neither a
    /// token nor a GitHub App, so [`TemplateClients::client`] answers `None` at once. The
    /// Kubernetes client is never contacted.
    fn reporter() -> Reporter {
        crate::install_crypto_provider();
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let secrets = SecretReader::new(kube::Client::try_from(config).unwrap());
        let clients = TemplateClients::new(ForgeMetrics::new(), Arc::new(secrets));
        Reporter::new(Arc::new(clients))
    }

    fn template() -> PreviewTemplate {
        let mut template = PreviewTemplate::new("web", PreviewTemplateSpec::default());
        template.metadata.namespace = Some("team".into());
        template
    }

    fn environment(name: &str, uid: &str) -> PreviewEnvironment {
        let mut environment = PreviewEnvironment::new(name, PreviewEnvironmentSpec::default());
        environment.metadata.namespace = Some("team".into());
        environment.metadata.uid = Some(uid.into());
        environment
    }

    /// What was sent for an environment: its comment's id and hashes.
    fn sent(comment_id: u64) -> ForgeReport {
        ForgeReport {
            comment_id: Some(comment_id),
            comment_sha: Some(format!("comment-{comment_id}")),
            status_sha: Some(format!("status-{comment_id}")),
            ..Default::default()
        }
    }

    /// What `report` starts from for `environment` when its status records nothing (a cache
    /// behind the last status write): the reporter's memory, or nothing.
    async fn remembered(
        reporter: &Reporter,
        environment: &PreviewEnvironment,
    ) -> Option<ForgeReport> {
        let nothing = PreviewEnvironmentStatus::default();
        let (record, result) = reporter.report(environment, &template(), &nothing).await;
        result.expect("no forge is called");
        record
    }

    #[test]
    fn a_report_stopped_by_a_failure_spends_the_parts_up_to_it_and_gives_back_the_rest() {
        let part = |part: &'static str, sha: &str, requests: &[&'static str]| PlannedPart {
            part,
            sha: sha.to_string(),
            requests: requests.to_vec(),
        };
        let parts = [
            part("comment", "c", &["comment"]),
            part(
                "deploy",
                "d",
                &["deployment", "deployment_status", "commit_status"],
            ),
            part("waiting", "w", &["commit_status"]),
        ];
        // The comment went out; the deploy part failed somewhere: it counts whole (the forge
        // may have counted the failing request), the waiting status after it was never sent.
        let after = ForgeReport {
            comment_sha: Some("c".into()),
            ..Default::default()
        };
        let (sent, unsent) = spent(&parts, &after, false);
        assert_eq!(
            sent,
            [
                "comment",
                "deployment",
                "deployment_status",
                "commit_status"
            ]
        );
        assert_eq!(unsent, 1);
        // All of it went out.
        let (sent, unsent) = spent(&parts, &ForgeReport::default(), true);
        assert_eq!((sent.len(), unsent), (5, 0));
        // The first part failed: only it is spent.
        let (sent, unsent) = spent(&parts, &ForgeReport::default(), false);
        assert_eq!((sent, unsent), (vec!["comment"], 4));
    }

    #[tokio::test]
    async fn forgetting_an_environment_drops_what_was_sent_for_it_and_nothing_of_another() {
        // docs/security.md: "the forge reports ... (forgotten with their environment)". The
        // controller calls `forget` when an environment is gone; without it the record of
        // every environment that ever lived would stay.
        let reporter = reporter();
        let gone = environment("web-pr-2", "uid-2");
        let kept = environment("web-pr-3", "uid-3");
        for (environment, record) in [(&gone, sent(2)), (&kept, sent(3))] {
            let status = PreviewEnvironmentStatus {
                forge: Some(record.clone()),
                ..Default::default()
            };
            let (reported, result) = reporter.report(environment, &template(), &status).await;
            result.expect("no forge is called");
            assert_eq!(reported, Some(record));
        }
        assert_eq!(remembered(&reporter, &gone).await, Some(sent(2)));
        assert_eq!(remembered(&reporter, &kept).await, Some(sent(3)));

        reporter.forget(&gone);

        // Looked at before `report` runs again (it remembers what it started from).
        let uids: Vec<String> = reporter.lock().keys().cloned().collect();
        assert_eq!(uids, ["uid-3"], "only the other environment is remembered");
        assert_eq!(
            remembered(&reporter, &gone).await,
            None,
            "the comment id and hashes of the removed environment are gone"
        );
        assert_eq!(
            remembered(&reporter, &kept).await,
            Some(sent(3)),
            "the other environment keeps its record"
        );
    }
}
