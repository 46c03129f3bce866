//! The sweep: on start-up and then every `--sweep-interval` (default 10 min), removes what
//! should no longer exist, by the pure rules of [`crate::lifecycle::rules`]:
//!
//! 1. facts from the forge: one list of open PRs/MRs and one list of branches per repository
//!    and page (GitHub with ETags, so an unchanged list costs no rate limit), never one call
//!    per environment. A repository whose forge cannot be asked gets no facts: none of its
//!    environments is removed for a forge reason in that sweep;
//! 2. every environment judged: PR closed, branch gone, idle, too old, template gone;
//! 3. namespaces carrying previewd's labels whose environment is gone.
//!
//! Every removal is logged, counted in `previewd_gc_deletions_total{reason}` and its reason
//! written on the environment (annotation), so the PR comment says why.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};

use crate::cluster::caches::Caches;
use crate::cluster::metrics::ClusterMetrics;
use crate::cluster::records::Records;
use crate::cluster::writer::Writer;
use crate::forge::template_client::TemplateClients;
use crate::lifecycle::metrics::SweepMetrics;
use crate::lifecycle::rules::{self, ForgeFacts, LabelledNamespace, Reason, Verdict};
use crate::model::crd::{ForgeKind, PreviewEnvironment, PreviewTemplate};
use crate::model::metadata::LABEL_MANAGED_BY;

/// What one sweep did.
#[derive(Clone, Debug, Default)]
pub struct SweepReport {
    /// (namespace/name, reason) of each environment deleted.
    pub deleted: Vec<(String, Reason)>,
    /// Namespaces deleted as orphans.
    pub orphans: Vec<String>,
    /// Repositories whose forge could not be asked (nothing removed for forge reasons).
    pub forge_unavailable: Vec<String>,
    /// Environments put to sleep (idle, and the template's `idleAction` is `Sleep`).
    pub slept: Vec<String>,
}

pub struct Sweeper {
    pub client: Client,
    /// Templates and environments, as the controller's watches see them.
    pub caches: Caches,
    pub metrics: SweepMetrics,
    /// Counts the sweep's writes with everyone else's.
    pub writes: ClusterMetrics,
    /// The one namespace previewd watches (`--watch-namespace`), if any.
    pub watch_namespace: Option<String>,
}

impl Sweeper {
    /// Sweeps on start-up and then every `interval`, until the future is dropped.
    pub async fn run(self, forge: &TemplateClients, interval: Duration) {
        self.caches.wait_until_ready().await;
        let mut ticker = tokio::time::interval(interval);
        loop {
            ticker.tick().await;
            match self.sweep(forge, Utc::now()).await {
                Ok(report) => tracing::info!(
                    deleted = report.deleted.len(),
                    slept = report.slept.len(),
                    orphans = report.orphans.len(),
                    forge_unavailable = ?report.forge_unavailable,
                    "sweep done"
                ),
                Err(e) => tracing::warn!(error = %e, "sweep failed; next one in {interval:?}"),
            }
        }
    }

    /// One sweep at time `now` (injected, so tests need not wait for hours to pass).
    pub async fn sweep(
        &self,
        forge: &TemplateClients,
        now: DateTime<Utc>,
    ) -> Result<SweepReport, kube::Error> {
        let mut report = SweepReport::default();
        let environments = self.caches.environments.state();
        let facts = self.gather_facts(forge, &mut report).await;
        for environment in &environments {
            self.judge_environment(environment, &facts, now, &mut report)
                .await?;
        }
        let live: Vec<&PreviewEnvironment> = environments.iter().map(|e| e.as_ref()).collect();
        report.orphans = self.remove_orphans(&live, now).await?;
        Ok(report)
    }

    /// 1. Forge facts, once per repository (`None` where the forge could not be asked).
    async fn gather_facts(&self, forge: &TemplateClients, report: &mut SweepReport) -> Facts {
        let mut facts = Facts::new();
        for template in self.caches.templates.state() {
            let key = repository_key(&template);
            if facts.contains_key(&key) {
                continue;
            }
            let gathered = forge_facts(forge, &template).await;
            if gathered.is_none() {
                report
                    .forge_unavailable
                    .push(template.spec.forge.repository.clone());
            }
            facts.insert(key, gathered);
        }
        facts
    }

    /// 2. One environment judged by the rules, and the verdict carried out.
    async fn judge_environment(
        &self,
        environment: &PreviewEnvironment,
        facts: &Facts,
        now: DateTime<Utc>,
        report: &mut SweepReport,
    ) -> Result<(), kube::Error> {
        let namespace = environment.namespace().unwrap_or_default();
        let template = self.caches.template(&namespace, &environment.spec.template);
        let repository_facts = template
            .as_ref()
            .and_then(|t| facts.get(&repository_key(t)).cloned().flatten());
        let name = format!("{namespace}/{}", environment.name_any());
        match rules::judge(
            environment,
            template.as_deref(),
            repository_facts.as_ref(),
            now,
        ) {
            Verdict::Keep => {}
            Verdict::Sleep => {
                self.put_to_sleep(environment).await?;
                report.slept.push(name);
            }
            Verdict::Delete(reason) => {
                if self.delete_environment(environment, reason).await? {
                    report.deleted.push((name, reason));
                }
            }
        }
        Ok(())
    }

    /// 3. Namespaces carrying previewd's labels whose environment is gone; returns those deleted.
    async fn remove_orphans(
        &self,
        live: &[&PreviewEnvironment],
        now: DateTime<Utc>,
    ) -> Result<Vec<String>, kube::Error> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let selector = format!("{LABEL_MANAGED_BY}=previewd");
        let labelled: Vec<LabelledNamespace> = namespaces
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .map(|ns| labelled_namespace(&ns))
            .collect();
        let mut removed = Vec::new();
        let watched = self.watch_namespace.as_deref();
        for orphan in rules::orphaned_namespaces(&labelled, live, watched, now) {
            tracing::info!(namespace = %orphan, reason = Reason::OrphanedNamespace.label(), "deleting orphaned namespace");
            let params = DeleteParams::default();
            match self
                .writer()
                .write("delete", namespaces.delete(&orphan, &params))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => continue,
                Err(e) => return Err(e),
            }
            self.metrics
                .deletions
                .with_label_values(&[Reason::OrphanedNamespace.label()])
                .inc();
            removed.push(orphan);
        }
        Ok(removed)
    }

    fn writer(&self) -> Writer {
        Writer::new(self.writes.clone())
    }

    /// Deletes an environment as judged; false if it was gone or had changed since the cache
    /// showed it (see [`delete_as_judged`]).
    async fn delete_environment(
        &self,
        environment: &PreviewEnvironment,
        reason: Reason,
    ) -> Result<bool, kube::Error> {
        let namespace = environment.namespace().unwrap_or_default();
        let writer = self.writer();
        let records = Records::new(&self.client, &writer);
        let deleted = records
            .delete_as_judged(environment, reason.sentence())
            .await?;
        // Logged and counted once the deletion happened: the verdict may have been on a copy
        // that changed since (delete_as_judged says so itself).
        if deleted {
            tracing::info!(environment = %environment.name_any(), %namespace, reason = reason.label(), "sweep deleted environment: {}", reason.sentence());
            self.metrics
                .deletions
                .with_label_values(&[reason.label()])
                .inc();
        }
        Ok(deleted)
    }

    /// Puts an idle environment to sleep (the template's `idleAction: Sleep`); the controller
    /// scales it to zero.
    async fn put_to_sleep(&self, environment: &PreviewEnvironment) -> Result<(), kube::Error> {
        let namespace = environment.namespace().unwrap_or_default();
        tracing::info!(environment = %environment.name_any(), %namespace, "sweep puts idle environment to sleep");
        let name = environment.name_any();
        let writer = self.writer();
        if Records::new(&self.client, &writer)
            .put_to_sleep(&namespace, &name)
            .await?
        {
            self.metrics.sleeps.inc();
        }
        Ok(())
    }
}

/// Forge facts by (forge, repository in lower case).
type Facts = HashMap<(ForgeKind, String), Option<ForgeFacts>>;

fn repository_key(template: &PreviewTemplate) -> (ForgeKind, String) {
    (
        template.spec.forge.kind,
        template.spec.forge.repository.to_lowercase(),
    )
}

fn labelled_namespace(namespace: &Namespace) -> LabelledNamespace {
    LabelledNamespace {
        name: namespace.name_any(),
        labels: namespace.labels().clone(),
        created: namespace
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| DateTime::<Utc>::from_timestamp(t.0.as_second(), 0)),
        terminating: namespace.metadata.deletion_timestamp.is_some(),
    }
}

/// Open PRs and branches of the template's repository; `None` if the forge could not be
/// asked (no token, outage, rate limit): then no forge rule applies.
async fn forge_facts(forge: &TemplateClients, template: &PreviewTemplate) -> Option<ForgeFacts> {
    let repository = &template.spec.forge.repository;
    let client = match forge.client(template).await {
        Ok(Some(client)) => client,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(%repository, error = %e, "sweep: no forge client; nothing removed for forge reasons");
            return None;
        }
    };
    let open = client.open_pull_requests(repository).await;
    let branches = client.branches(repository).await;
    match (open, branches) {
        (Ok(open_pull_requests), Ok(branches)) => Some(ForgeFacts {
            open_pull_requests,
            branches,
        }),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(%repository, error = %e, "sweep: the forge could not be asked; nothing removed for forge reasons");
            None
        }
    }
}
