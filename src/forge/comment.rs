//! The one comment previewd keeps on a pull/merge request (pure): its text for each state of
//! the environment, and the hidden marker by which it is found again.
//!
//! The text depends only on the environment's state, never on the clock, so an unchanged
//! environment renders the same text and the comment is not edited.
//!
//! Messages (conditions, a held commit's reason) quote what others wrote: a chart's `fail`
//! text, an engine's or the API server's error, a CI check's name. They go into the comment as
//! code blocks ([`as_text`]), so none of it renders as headings, links, images or @-mentions
//! under previewd's name, in the comment maintainers read before they approve a fork.

use std::fmt::Write;

use chrono::{DateTime, Utc};

use crate::model::crd::{Phase, PreviewEnvironmentStatus, WaitingReason};
use crate::model::footprint::{self, Prices};

/// What the comment says the environment is doing.
#[derive(Clone, Debug, PartialEq)]
pub enum CommentState<'a> {
    Live(&'a PreviewEnvironmentStatus),
    Destroyed { reason: &'a str },
}

/// Everything the comment shows.
#[derive(Clone, Debug)]
pub struct CommentInput<'a> {
    /// `namespace/name` of the PreviewEnvironment: identifies the comment.
    pub environment: &'a str,
    pub head_sha: &'a str,
    pub state: CommentState<'a>,
    /// When the environment expires if nothing happens (idle timeout or max age).
    pub expires_at: Option<DateTime<Utc>>,
    /// previewd's answer to the last comment command, one line of Markdown.
    pub last_command: Option<String>,
    /// The operator's prices: the footprint's cost is shown with them.
    pub prices: Option<&'a Prices>,
}

/// The hidden first line that identifies previewd's comment for `environment`.
pub fn marker(environment: &str) -> String {
    format!("<!-- previewd:environment={environment} -->")
}

/// The comment's full text.
pub fn render(input: &CommentInput<'_>) -> String {
    let mut out = marker(input.environment);
    out.push('\n');
    let short_sha: String = input.head_sha.chars().take(7).collect();
    match &input.state {
        CommentState::Destroyed { reason } => {
            let _ = write!(
                out,
                "### Preview environment: destroyed\n\nThe environment was removed: {reason}.\n"
            );
        }
        CommentState::Live(status) => render_live(&mut out, status, &short_sha, input),
    }
    if let Some(answer) = &input.last_command {
        let _ = write!(out, "\n> {answer}\n");
    }
    out.push_str("\n<sub>Kept up to date by previewd: this comment is edited in place.</sub>\n");
    out
}

fn render_live(
    out: &mut String,
    status: &PreviewEnvironmentStatus,
    short_sha: &str,
    input: &CommentInput<'_>,
) {
    render_headline(out, status, short_sha);
    render_cluster(out, status);
    render_waiting(out, status);
    render_why(out, status);
    render_objects(out, status);
    render_seeds(out, status);
    render_databases(out, status);
    render_footprint(out, status, input.prices);
    if let Some(expires_at) = input.expires_at {
        let _ = writeln!(
            out,
            "Expires {} unless there is a new push.",
            expires_at.format("%Y-%m-%d %H:%M UTC")
        );
    }
}

/// What the environment requests and has cost, once it runs (as of its record's last change:
/// the comment never reads a clock).
fn render_footprint(out: &mut String, status: &PreviewEnvironmentStatus, prices: Option<&Prices>) {
    let running = matches!(
        status.phase,
        Phase::Ready | Phase::Degraded | Phase::Sleeping
    );
    if let (Some(footprint), true) = (&status.footprint, running) {
        let _ = writeln!(out, "{}\n", footprint::describe(footprint, prices));
    }
}

/// The phase in words, and where the environment is (or will be).
fn render_headline(out: &mut String, status: &PreviewEnvironmentStatus, short_sha: &str) {
    let waiting_reason = status.waiting.as_ref().map(|w| w.reason);
    let headline = match status.phase {
        Phase::Pending if waiting_reason == Some(WaitingReason::AwaitingChecks) => "waiting for CI",
        Phase::Pending if waiting_reason == Some(WaitingReason::Skipped) => "no preview",
        Phase::Pending => "queued",
        Phase::Queued => "queued",
        Phase::Deploying => "deploying",
        Phase::Seeding => "loading seed data",
        Phase::Ready => "ready",
        Phase::Degraded => "degraded",
        Phase::Sleeping => "sleeping",
        Phase::Terminating => "being removed",
    };
    let _ = writeln!(out, "### Preview environment: {headline}\n");
    match (&status.url, status.phase) {
        (Some(url), Phase::Ready) => {
            let _ = writeln!(out, "**{url}** (commit `{short_sha}`)\n");
        }
        // How to wake it (opening the URL, when previewd's gate answers it) is said below.
        (Some(url), Phase::Sleeping) => {
            let _ = writeln!(out, "**{url}** (commit `{short_sha}`, asleep)\n");
        }
        (Some(url), _) => {
            let _ = writeln!(out, "Will be at {url} (commit `{short_sha}`)\n");
        }
        // Every object is healthy, so had one routed the host its URL would be here.
        (None, Phase::Ready) => {
            let _ = writeln!(
                out,
                "Commit `{short_sha}`. No URL: no Ingress or HTTPRoute of the environment routes its host.\n"
            );
        }
        (None, _) => {
            let _ = writeln!(out, "Commit `{short_sha}`\n");
        }
    }
}

/// The registered cluster the environment runs on, and whether it answers (its name is the
/// operator's `PreviewCluster`'s, a DNS name).
fn render_cluster(out: &mut String, status: &PreviewEnvironmentStatus) {
    let Some(cluster) = &status.cluster else {
        return;
    };
    let name = &cluster.name;
    match (cluster.reachable, cluster.unreachable_since) {
        (true, _) => {
            let _ = writeln!(
                out,
                "Runs on cluster `{name}`.
"
            );
        }
        (false, since) => {
            let since = since
                .map(|t| format!(" since {}", t.format("%Y-%m-%d %H:%M UTC")))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "Runs on cluster `{name}`, which has not answered{since}: shown as last seen; nothing is removed meanwhile.\n"
            );
        }
    }
}

/// A new head commit held back while the one deployed before keeps running (when nothing runs
/// yet, the `Ready` condition already says why: see [`render_why`]).
fn render_waiting(out: &mut String, status: &PreviewEnvironmentStatus) {
    let (Some(waiting), Some(deployed)) = (&status.waiting, &status.deployed_sha) else {
        return;
    };
    let said = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.message == waiting.message);
    if deployed == &waiting.sha || said {
        return;
    }
    let deployed: String = deployed.chars().take(7).collect();
    let label = match waiting.skipped() {
        true => "Not deployed",
        false => "Not deployed yet",
    };
    let _ = writeln!(
        out,
        "**{label}** (commit `{deployed}` keeps running meanwhile):\n{}",
        as_text(&waiting.message)
    );
}

/// What failed, the queue position, or why it waits or sleeps.
fn render_why(out: &mut String, status: &PreviewEnvironmentStatus) {
    let why = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.message.as_str());
    let why = why.filter(|why| !why.trim().is_empty()).map(as_text);
    match (status.phase, why) {
        (Phase::Degraded, Some(why)) => {
            let _ = writeln!(out, "**What failed:**\n{why}");
        }
        (Phase::Queued, why) => {
            let position = status.queue_position.unwrap_or(1);
            let _ = writeln!(out, "**Position {position} in the queue.**\n");
            out.push_str(&why.map(|why| format!("{why}\n")).unwrap_or_default());
        }
        (Phase::Pending | Phase::Sleeping, Some(why)) => {
            let _ = writeln!(out, "{why}");
        }
        _ => {}
    }
}

/// The most of a message the comment shows: enough for a refusal that names a dozen objects.
const MAX_QUOTED_LINES: usize = 40;
const MAX_QUOTED_CHARS: usize = 4000;

/// `message` as a fenced code block that renders as the text it is: its fence is longer than
/// any run of backticks in it (so nothing in it closes the block), control characters but line
/// breaks and tabs are dropped, and it is cut at [`MAX_QUOTED_LINES`] / [`MAX_QUOTED_CHARS`].
pub fn as_text(message: &str) -> String {
    let clean: String = message
        .chars()
        .filter(|c| !c.is_control() || matches!(c, '\n' | '\t'))
        .take(MAX_QUOTED_CHARS)
        .collect();
    let lines: Vec<&str> = clean.lines().take(MAX_QUOTED_LINES).collect();
    let mut longest_run = 0;
    let mut run = 0;
    for c in clean.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest_run = longest_run.max(run);
    }
    let fence = "`".repeat(longest_run.max(2) + 1);
    format!("{fence}text\n{}\n{fence}\n", lines.join("\n"))
}

/// How many objects are ready (until all are), and the state of each workload.
fn render_objects(out: &mut String, status: &PreviewEnvironmentStatus) {
    if status.resources.is_empty() {
        return;
    }
    let ready = status
        .resources
        .iter()
        .filter(|r| r.state == "Ready")
        .count();
    if status.phase != Phase::Ready {
        let _ = writeln!(
            out,
            "{ready} of {} objects ready.\n",
            status.resources.len()
        );
    }
    let workloads: Vec<_> = status
        .resources
        .iter()
        .filter(|r| matches!(r.kind.as_str(), "Deployment" | "StatefulSet"))
        .collect();
    if !workloads.is_empty() {
        out.push_str("| service | state |\n|---|---|\n");
        for workload in workloads {
            let _ = writeln!(out, "| {} | {} |", workload.name, workload.state);
        }
        out.push('\n');
    }
}

fn render_seeds(out: &mut String, status: &PreviewEnvironmentStatus) {
    for seed in &status.seeds {
        let detail = seed
            .message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        let _ = writeln!(out, "Seed **{}**: {}{detail}", seed.name, seed.state);
    }
    if !status.seeds.is_empty() {
        out.push('\n');
    }
}

/// Each database's state, and how long its branch took (its name is a DNS label: previewd
/// refuses any other before it writes the status).
fn render_databases(out: &mut String, status: &PreviewEnvironmentStatus) {
    for database in &status.databases {
        let took = database
            .branched_in_ms
            .map(|ms| {
                format!(
                    ", branched from its baseline in {:.1} s",
                    ms as f64 / 1000.0
                )
            })
            .unwrap_or_default();
        let name: String = database
            .name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        // A placed environment's status comes from another cluster: only previewd's words.
        let state = match database.state.as_str() {
            "Ready" => "Ready",
            "Kept" => "kept until the environment goes",
            _ => "unknown",
        };
        let _ = writeln!(out, "Database **{name}**: {state}{took}");
    }
    if !status.databases.is_empty() {
        out.push('\n');
    }
}

/// The commit-status state for an environment's phase: `(github, gitlab)` words.
pub fn commit_state(phase: Phase) -> CommitState {
    match phase {
        // Asleep is still a good deployment of the commit.
        Phase::Ready | Phase::Sleeping => CommitState::Success,
        Phase::Degraded => CommitState::Failure,
        Phase::Pending | Phase::Queued => CommitState::Pending,
        _ => CommitState::Running,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitState {
    Pending,
    Running,
    Success,
    Failure,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::crd::{Condition, ResourceStatus, SeedStatus};

    fn status(phase: Phase) -> PreviewEnvironmentStatus {
        PreviewEnvironmentStatus {
            phase,
            url: Some("https://changes.preview.example.com".into()),
            resources: vec![
                ResourceStatus {
                    api_version: "apps/v1".into(),
                    kind: "Deployment".into(),
                    name: "web".into(),
                    wave: 0,
                    state: "Ready".into(),
                    message: None,
                },
                ResourceStatus {
                    api_version: "v1".into(),
                    kind: "Service".into(),
                    name: "web".into(),
                    wave: 0,
                    state: if phase == Phase::Ready {
                        "Ready"
                    } else {
                        "Applied"
                    }
                    .into(),
                    message: None,
                },
            ],
            seeds: vec![SeedStatus {
                name: "load-sql".into(),
                job: "seed-load-sql-abc".into(),
                state: "Succeeded".into(),
                message: None,
            }],
            ..Default::default()
        }
    }

    fn input<'a>(state: CommentState<'a>) -> CommentInput<'a> {
        CommentInput {
            environment: "previews/web-pr-2-abc123",
            head_sha: "ec26c3e57ca3a959ca5aad62de7213c562f8c821",
            state,
            expires_at: Some("2026-11-25T10:00:00Z".parse().unwrap()),
            last_command: None,
            prices: None,
        }
    }

    #[test]
    fn a_running_environment_shows_its_footprint_and_its_cost_with_prices() {
        let mut ready = status(Phase::Ready);
        let since = "2026-11-24T10:00:00Z".parse().unwrap();
        let requests = footprint::Requests {
            cpu_millicores: 600,
            memory_bytes: 640 << 20,
        };
        ready.footprint = Some(footprint::account(
            None,
            requests,
            false,
            since,
            footprint::REFRESH,
        ));
        let text = render(&input(CommentState::Live(&ready)));
        assert!(
            text.contains("**Footprint** (as of 2026-11-24 10:00 UTC): 0.6 cores and 640 MiB requested while awake · awake 0 min"),
            "{text}"
        );
        let prices = Prices {
            per_core_hour: 0.05,
            per_gib_hour: 0.01,
            currency: "$".into(),
        };
        let mut priced = input(CommentState::Live(&ready));
        priced.prices = Some(&prices);
        assert!(
            render(&priced).contains("≈ $0.04 an hour"),
            "{}",
            render(&priced)
        );
        let deploying = status(Phase::Deploying);
        assert!(!render(&input(CommentState::Live(&deploying))).contains("Footprint"));
    }

    #[test]
    fn ready_shows_url_services_seeds_and_expiry_after_the_marker() {
        let ready = status(Phase::Ready);
        let text = render(&input(CommentState::Live(&ready)));
        assert!(text.starts_with("<!-- previewd:environment=previews/web-pr-2-abc123 -->\n"));
        assert!(text.contains("Preview environment: ready"));
        assert!(text.contains("**https://changes.preview.example.com** (commit `ec26c3e`)"));
        assert!(text.contains("| web | Ready |"));
        assert!(text.contains("Seed **load-sql**: Succeeded"));
        assert!(text.contains("Expires 2026-11-25 10:00 UTC"));
        // Nothing routes the host: no link to nothing, and why.
        let unrouted = PreviewEnvironmentStatus {
            url: None,
            ..status(Phase::Ready)
        };
        let text = render(&input(CommentState::Live(&unrouted)));
        assert!(!text.contains("https://"), "{text}");
        assert!(text.contains("No URL: no Ingress or HTTPRoute"), "{text}");
    }

    #[test]
    fn deploying_shows_progress_and_degraded_says_what_failed() {
        let deploying = status(Phase::Deploying);
        assert!(render(&input(CommentState::Live(&deploying))).contains("1 of 2 objects ready."));
        let mut degraded = status(Phase::Degraded);
        degraded.conditions.push(Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: "SeedFailed".into(),
            message: "seed load-sql (Job seed-load-sql-abc) failed: BackoffLimitExceeded".into(),
            last_transition_time: Utc::now(),
        });
        let text = render(&input(CommentState::Live(&degraded)));
        assert!(
            text.contains(
                "**What failed:**\n```text\nseed load-sql (Job seed-load-sql-abc) failed"
            )
        );
    }

    /// Each database says its state and how long its branch took, in previewd's own words:
    /// a status read back from another cluster (or written by hand) names nothing else.
    #[test]
    fn each_database_says_its_state_and_branch_time_in_previewds_words_only() {
        use crate::model::crd::DatabaseStatus;
        let mut ready = status(Phase::Ready);
        let database = |name: &str, state: &str, ms: Option<u64>| DatabaseStatus {
            name: name.into(),
            state: state.into(),
            branched_in_ms: ms,
            ..Default::default()
        };
        ready.databases = vec![
            database("orders", "Ready", Some(1220)),
            database("users", "Kept", None),
            database(
                "x](https://evil.example) <img src=x>",
                "**Approved** @acme/admins",
                None,
            ),
        ];
        let text = render(&input(CommentState::Live(&ready)));
        assert!(
            text.contains("Database **orders**: Ready, branched from its baseline in 1.2 s\n"),
            "{text}"
        );
        assert!(text.contains("Database **users**: kept until the environment goes\n"));
        assert!(
            text.contains("Database **xhttpsevilexampleimgsrcx**: unknown\n"),
            "{text}"
        );
        for hostile in ["evil.example", "<img", "Approved", "@acme"] {
            assert!(
                !text.contains(hostile),
                "{hostile} reached the comment:\n{text}"
            );
        }
    }

    /// A chart's `fail` message (or an engine's error) is quoted, not rendered: no heading,
    /// link, image, HTML or @-mention of it reaches the comment as Markdown, whatever backticks
    /// it holds to close the quote.
    #[test]
    fn messages_from_input_render_as_text() {
        let hostile = "execution error at (app/templates/x.yaml:1:4): ```\n# Approved by the platform team\n[merge me](https://evil.example) ![x](https://evil.example/x.png) <img src=x> @acme/admins\n````\r\u{1b}[2J";
        let quoted = as_text(hostile);
        let fence = "`````";
        assert!(quoted.starts_with(&format!("{fence}text\n")), "{quoted}");
        assert!(quoted.ends_with(&format!("\n{fence}\n")), "{quoted}");
        let inside = &quoted[fence.len() + 5..quoted.len() - fence.len() - 2];
        assert!(
            !inside.contains(fence),
            "nothing inside closes the block: {quoted}"
        );
        assert!(
            !quoted.contains('\r') && !quoted.contains('\u{1b}'),
            "{quoted:?}"
        );
        let mut degraded = status(Phase::Degraded);
        degraded.conditions.push(Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: "RenderFailed".into(),
            message: hostile.into(),
            last_transition_time: Utc::now(),
        });
        let text = render(&input(CommentState::Live(&degraded)));
        assert!(
            text.contains(&format!("**What failed:**\n{quoted}")),
            "{text}"
        );
        // A long message is cut, not posted whole.
        let long = "line\n".repeat(500);
        assert_eq!(as_text(&long).lines().count(), MAX_QUOTED_LINES + 2);
    }

    #[test]
    fn destroyed_says_why_and_the_same_state_renders_the_same_text() {
        let text = render(&input(CommentState::Destroyed {
            reason: "the pull request was merged",
        }));
        assert!(text.contains("destroyed") && text.contains("the pull request was merged"));
        let ready = status(Phase::Ready);
        assert_eq!(
            render(&input(CommentState::Live(&ready))),
            render(&input(CommentState::Live(&ready)))
        );
    }

    #[test]
    fn a_held_back_head_is_named_next_to_the_commit_that_keeps_running() {
        let waiting = crate::model::crd::WaitingCommit {
            sha: "1f2e3d4c5b6a79880716253443526170f8e9dacb".into(),
            reason: WaitingReason::AwaitingChecks,
            message: "Commit `1f2e3d4` deploys once CI passes: waiting for `build` (running)."
                .into(),
            since: Utc::now(),
        };
        let ready = PreviewEnvironmentStatus {
            deployed_sha: Some("ec26c3e57ca3a959ca5aad62de7213c562f8c821".into()),
            waiting: Some(waiting.clone()),
            ..status(Phase::Ready)
        };
        let text = render(&input(CommentState::Live(&ready)));
        assert!(text.contains("Preview environment: ready"), "{text}");
        assert!(text.contains("**Not deployed yet** (commit `ec26c3e` keeps running meanwhile):\n```text\nCommit `1f2e3d4` deploys once CI passes: waiting for `build` (running).\n```"), "{text}");
        // The first commit waits: nothing runs, the headline says what for.
        let mut first = status(Phase::Pending);
        first.resources.clear();
        first.waiting = Some(waiting.clone());
        first.conditions.push(Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: "AwaitingChecks".into(),
            message: waiting.message.clone(),
            last_transition_time: Utc::now(),
        });
        let text = render(&input(CommentState::Live(&first)));
        assert!(
            text.contains("Preview environment: waiting for CI"),
            "{text}"
        );
        assert_eq!(
            text.matches("deploys once CI passes").count(),
            1,
            "said once: {text}"
        );
    }

    #[test]
    fn an_environment_on_a_registered_cluster_names_it_and_says_when_it_does_not_answer() {
        let mut running = status(Phase::Ready);
        running.cluster = Some(crate::model::crd::ClusterOfEnvironment {
            name: "eu-1".into(),
            reachable: true,
            unreachable_since: None,
        });
        let text = render(&input(CommentState::Live(&running)));
        assert!(text.contains("Runs on cluster `eu-1`."), "{text}");
        running.cluster = Some(crate::model::crd::ClusterOfEnvironment {
            name: "eu-1".into(),
            reachable: false,
            unreachable_since: chrono::DateTime::from_timestamp(1_800_000_000, 0),
        });
        let text = render(&input(CommentState::Live(&running)));
        assert!(
            text.contains("`eu-1`, which has not answered since 2027-01-15 08:00 UTC: shown as last seen; nothing is removed meanwhile."),
            "{text}"
        );
        assert!(text.contains("### Preview environment: ready"), "{text}");
    }

    #[test]
    fn a_skipped_first_commit_says_no_preview_and_why() {
        let message = "No preview for commit `1f2e3d4`: only `docs/` changed.";
        let mut first = status(Phase::Pending);
        first.resources.clear();
        first.waiting = Some(crate::model::crd::WaitingCommit {
            sha: "1f2e3d4c5b6a79880716253443526170f8e9dacb".into(),
            reason: WaitingReason::Skipped,
            message: message.into(),
            since: Utc::now(),
        });
        first.conditions.push(Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: "Skipped".into(),
            message: message.into(),
            last_transition_time: Utc::now(),
        });
        let text = render(&input(CommentState::Live(&first)));
        assert!(text.contains("Preview environment: no preview"), "{text}");
        assert_eq!(text.matches(message).count(), 1, "said once: {text}");
    }
}
