//! Which reports go out now, by the content budget ([`super::budget`]), and what became of
//! the ones held back: a held report is never sent later as it was; the environment comes
//! back at the time the budget names, its report is planned from its newest status then, and
//! a part of the held one that the newer report no longer says was superseded (counted, never
//! sent).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::budget::{ContentBudgets, ContentLimits, NotNow, Party, Urgency};
use super::metrics::ForgeMetrics;
use super::report_plan::PlannedPart;
use super::transport::ForgeApiError;
use crate::model::crd::{ForgeKind, Phase};

/// Whether a report of an environment in `phase` says where it came to rest. A report that
/// only edits the comment of an environment whose phase was reported already (a reply to a
/// comment command, a queue position, the seeds' results) is not: it never takes the quarter
/// of each window kept for final reports, though replies to anyone who may comment still share
/// the other three quarters with every environment's intermediate reports. A change of phase
/// (asleep, awake, queued) is final, comment alone or not.
pub fn urgency_of(phase: Phase, only_a_comment_edit: bool) -> Urgency {
    match phase {
        _ if only_a_comment_edit => Urgency::Intermediate,
        Phase::Ready | Phase::Degraded | Phase::Sleeping | Phase::Queued => Urgency::Final,
        Phase::Pending | Phase::Deploying | Phase::Seeding | Phase::Terminating => {
            Urgency::Intermediate
        }
    }
}

/// One environment's report, for the budget: its UID, the repository it previews (the shares
/// of the budget are per environment and per repository), the budget it spends, its forge,
/// and the phase it reports (`None`: the environment is gone).
pub struct Asking<'a> {
    pub environment: &'a str,
    pub repository: &'a str,
    pub budget: &'a str,
    pub forge: ForgeKind,
    pub phase: Option<Phase>,
}

pub struct Admissions {
    budgets: ContentBudgets,
    /// Reports held back, by environment UID.
    held: Mutex<HashMap<String, Held>>,
    /// The phase of each environment's last report let through, by UID.
    reported: Mutex<HashMap<String, Phase>>,
    metrics: ForgeMetrics,
}

struct Held {
    parts: Vec<PlannedPart>,
    /// When the environment's first report held back was asked for.
    since: Instant,
}

impl Admissions {
    pub fn new(limits: ContentLimits, metrics: ForgeMetrics) -> Self {
        Self {
            budgets: ContentBudgets::new(limits),
            held: Mutex::default(),
            reported: Mutex::default(),
            metrics,
        }
    }

    fn reported(&self) -> std::sync::MutexGuard<'_, HashMap<String, Phase>> {
        self.reported
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How urgent `asking`'s report of `parts` is ([`urgency_of`]); a removal is final.
    fn urgency(&self, asking: &Asking, parts: &[PlannedPart]) -> Urgency {
        let Some(phase) = asking.phase else {
            return Urgency::Final;
        };
        let comment_alone = parts.iter().all(|part| part.part == "comment");
        let same_phase = self.reported().get(asking.environment) == Some(&phase);
        urgency_of(phase, comment_alone && same_phase)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a report of `parts` goes out now: `Some(at)`, counted at `at`
    /// ([`Admissions::settle`]); `None` when it has nothing to send. One that does not fit is
    /// [`ForgeApiError::ContentBudget`] with when to come back: a final report keeps its place
    /// in line meanwhile; an intermediate one is held, and superseded if a newer one differs.
    pub fn admit(
        &self,
        asking: &Asking,
        parts: Vec<PlannedPart>,
    ) -> Result<Option<Instant>, ForgeApiError> {
        let urgency = self.urgency(asking, &parts);
        let forge = asking.forge.as_str();
        let previous = self.held().remove(asking.environment);
        if let Some(previous) = &previous {
            for held in &previous.parts {
                for request in superseded(held, &parts) {
                    self.count(forge, request, "superseded");
                }
            }
        }
        let requests: u32 = parts.iter().map(|part| part.requests.len() as u32).sum();
        let budget = self.budgets.of(asking.budget);
        if requests == 0 {
            budget.leave_line(asking.environment);
            return Ok(None);
        }
        // Both forges compare repository names without case.
        let repository = asking.repository.to_lowercase();
        let party = Party {
            environment: asking.environment,
            repository: &repository,
        };
        match budget.admit(&party, requests, urgency) {
            Ok(at) => {
                if let Some(phase) = asking.phase {
                    self.reported()
                        .insert(asking.environment.to_string(), phase);
                }
                if let Some(previous) = previous {
                    let waited = previous.since.elapsed().as_secs_f64();
                    self.metrics
                        .content_wait
                        .with_label_values(&[forge])
                        .observe(waited);
                }
                Ok(Some(at))
            }
            Err(NotNow { wait }) => {
                let since = previous.map_or_else(Instant::now, |previous| previous.since);
                let held = Held { parts, since };
                self.held().insert(asking.environment.to_string(), held);
                Err(ForgeApiError::ContentBudget { wait })
            }
        }
    }

    /// The forge refused a request for its own limit: budget `key` sends nothing for `wait`.
    pub fn pause(&self, key: &str, wait: Duration) {
        self.budgets.of(key).pause(wait);
    }

    /// What became of a report admitted `at`: the requests `sent` (by kind) are counted, and
    /// the `unsent` ones (the report stopped at a failure before them) given back.
    pub fn settle(&self, asking: &Asking, at: Instant, sent: &[&str], unsent: u32) {
        let forge = asking.forge.as_str();
        for request in sent {
            self.count(forge, request, "sent");
        }
        if unsent > 0 {
            self.budgets.of(asking.budget).refund(at, unsent);
        }
    }

    /// Drops what was held for a removed environment, and its place in any line.
    pub fn forget(&self, environment: &str) {
        self.held().remove(environment);
        self.reported().remove(environment);
        self.budgets.leave_lines(environment);
    }

    fn count(&self, forge: &str, kind: &str, outcome: &str) {
        let labels = [forge, kind, outcome];
        self.metrics
            .content_requests
            .with_label_values(&labels)
            .inc();
    }
}

/// The requests of `held` that the newer report's `parts` replace: none when it says the
/// same; else each, except a creation (of a GitHub deployment, a GitLab environment) that
/// the newer report makes too, which is the same object, not a newer word.
fn superseded<'a>(held: &'a PlannedPart, parts: &[PlannedPart]) -> Vec<&'a str> {
    if parts.contains(held) {
        return Vec::new();
    }
    let newer = parts.iter().find(|part| part.part == held.part);
    let made_again = |request: &str| {
        matches!(request, "deployment" | "environment")
            && newer.is_some_and(|part| part.requests.contains(&request))
    };
    held.requests
        .iter()
        .copied()
        .filter(|request| !made_again(request))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(part: &'static str, sha: &str, requests: &[&'static str]) -> PlannedPart {
        PlannedPart {
            part,
            sha: sha.to_string(),
            requests: requests.to_vec(),
        }
    }

    fn count(metrics: &ForgeMetrics, kind: &str, outcome: &str) -> u64 {
        let labels = ["github", kind, outcome];
        metrics.content_requests.with_label_values(&labels).get()
    }

    #[test]
    fn where_an_environment_comes_to_rest_is_final_and_a_step_on_the_way_is_not() {
        // docs/forges.md: "Final reports (Ready, Degraded, Sleeping, Queued, and the
        // removal's)", "Intermediate reports (Pending, Deploying, Seeding, and an edit of the
        // comment alone in a phase already reported)".
        for phase in [
            Phase::Ready,
            Phase::Degraded,
            Phase::Sleeping,
            Phase::Queued,
        ] {
            assert_eq!(urgency_of(phase, false), Urgency::Final, "{phase:?}");
            assert_eq!(urgency_of(phase, true), Urgency::Intermediate, "{phase:?}");
        }
        for phase in [Phase::Pending, Phase::Deploying, Phase::Seeding] {
            assert_eq!(urgency_of(phase, false), Urgency::Intermediate, "{phase:?}");
        }
    }

    #[test]
    fn a_comment_edit_in_the_phase_reported_waits_for_room_but_a_new_phase_does_not() {
        let metrics = ForgeMetrics::new();
        let limits = ContentLimits {
            per_minute: 8,
            per_hour: 500,
        };
        let admissions = Admissions::new(limits, metrics);
        let asking = |phase| Asking {
            environment: "a",
            repository: "org/web",
            budget: "installation-1",
            forge: ForgeKind::Github,
            phase: Some(phase),
        };
        let comment = |sha| vec![part("comment", sha, &["comment"])];
        let ready = vec![
            part("comment", "ready", &["comment"]),
            part(
                "deploy",
                "ok",
                &["deployment", "deployment_status", "commit_status"],
            ),
        ];
        // Another environment's final report takes 4 of 8; `a` reported Ready before.
        let other = Asking {
            environment: "x",
            repository: "org/other",
            ..asking(Phase::Ready)
        };
        admissions.admit(&other, ready).unwrap().unwrap();
        admissions.reported().insert("a".into(), Phase::Ready);
        // 4 of 8 spent: a command's reply (the comment alone, still Ready) would leave less
        // than the quarter kept for final reports... after two of them.
        admissions
            .admit(&asking(Phase::Ready), comment("reply-1"))
            .unwrap()
            .unwrap();
        admissions
            .admit(&asking(Phase::Ready), comment("reply-2"))
            .unwrap()
            .unwrap();
        let reply = admissions.admit(&asking(Phase::Ready), comment("reply-3"));
        assert!(
            matches!(reply, Err(ForgeApiError::ContentBudget { .. })),
            "{reply:?}"
        );
        // Asleep: the comment alone too, but a new phase is final and takes the last rooms.
        let asleep = admissions.admit(&asking(Phase::Sleeping), comment("asleep"));
        assert!(matches!(asleep, Ok(Some(_))), "{asleep:?}");
    }

    #[test]
    fn a_held_intermediate_report_is_superseded_by_the_final_one_and_never_sent() {
        let metrics = ForgeMetrics::new();
        let limits = ContentLimits {
            per_minute: 8,
            per_hour: 500,
        };
        let admissions = Admissions::new(limits, metrics.clone());
        let asking = |environment, phase| Asking {
            environment,
            repository: "org/web",
            budget: "installation-1",
            forge: ForgeKind::Github,
            phase: Some(phase),
        };
        let comment = |sha| part("comment", sha, &["comment"]);
        let deploy = |sha| part("deploy", sha, &["deployment_status", "commit_status"]);
        // Another environment's final report takes 7 of the minute's 8.
        let other = vec![
            comment("x"),
            deploy("x"),
            part("waiting", "x", &["commit_status"]),
        ];
        let other = [other, vec![comment("y"), deploy("y")]].concat();
        let other_at = admissions.admit(&asking("b", Phase::Ready), other).unwrap();
        assert!(other_at.is_some());
        // Deploying: it would take the reserve (a quarter), so it is held, not sent.
        let new_deploy = |sha| {
            let requests = ["deployment", "deployment_status", "commit_status"];
            part("deploy", sha, &requests)
        };
        let deploying = vec![comment("deploying"), new_deploy("in-progress")];
        let held = admissions.admit(&asking("a", Phase::Deploying), deploying);
        assert!(
            matches!(held, Err(ForgeApiError::ContentBudget { .. })),
            "{held:?}"
        );
        assert_eq!(count(&metrics, "comment", "sent"), 0, "nothing was sent");
        // Ready: the final report waits its turn, then goes; what Deploying would have said is
        // superseded, once.
        let ready = vec![comment("ready"), new_deploy("success")];
        let refused = admissions.admit(&asking("a", Phase::Ready), ready.clone());
        assert!(
            matches!(refused, Err(ForgeApiError::ContentBudget { .. })),
            "{refused:?}"
        );
        assert_eq!(count(&metrics, "comment", "superseded"), 1);
        assert_eq!(count(&metrics, "deployment_status", "superseded"), 1);
        assert_eq!(count(&metrics, "commit_status", "superseded"), 1);
        // The deployment of the head is made by the final report: the same object, not
        // superseded.
        assert_eq!(count(&metrics, "deployment", "superseded"), 0);
        // Its turn: the minute has passed (played by a budget of another key: the one above
        // is full for a minute, which a unit test does not wait for).
        let next = Asking {
            budget: "installation-2",
            ..asking("a", Phase::Ready)
        };
        let at = admissions.admit(&next, ready).unwrap().unwrap();
        // The comment went out; the deployment failed, so the rest was never sent: given back.
        admissions.settle(&next, at, &["comment"], 3);
        assert_eq!(count(&metrics, "comment", "sent"), 1);
        assert_eq!(count(&metrics, "deployment", "sent"), 0);
        let budget = admissions.budgets.of("installation-2");
        let third = budget.admit(
            &Party {
                environment: "c",
                repository: "org/other",
            },
            7,
            Urgency::Final,
        );
        assert!(third.is_ok(), "7 of the 8 are free again: {third:?}");
        assert_eq!(
            count(&metrics, "comment", "superseded"),
            1,
            "the same held report counts once"
        );
        let waited = metrics.content_wait.with_label_values(&["github"]);
        assert_eq!(waited.get_sample_count(), 1);
    }
}
