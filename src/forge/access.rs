//! Whether a comment's author may give previewd commands: write access to the template's
//! repository, asked of the forge and kept for [`ACCESS_TTL`], so a burst of commands costs
//! one forge call and a revoked permission stops working within a minute.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::template_client::{ForgeCallError, TemplateClients};
use crate::model::crd::{ForgeKind, PreviewTemplate};

/// How long a write-access answer is trusted.
pub const ACCESS_TTL: Duration = Duration::from_secs(60);

/// (forge, API URL, repository in lower case, user).
type AccessKey = (ForgeKind, String, String, String);

pub struct WriteAccess {
    clients: Arc<TemplateClients>,
    answers: Mutex<Answers>,
}

/// The forge's answers, each with when it was given.
#[derive(Default)]
struct Answers(HashMap<AccessKey, (bool, Instant)>);

impl Answers {
    /// The answer for `key`, unless it is [`ACCESS_TTL`] old at `now`.
    fn get(&self, key: &AccessKey, now: Instant) -> Option<bool> {
        let (answer, at) = self.0.get(key)?;
        (now.saturating_duration_since(*at) < ACCESS_TTL).then_some(*answer)
    }

    /// Keeps `answer`, and drops every answer too old to be used.
    fn put(&mut self, key: AccessKey, answer: bool, now: Instant) {
        self.0
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < ACCESS_TTL);
        self.0.insert(key, (answer, now));
    }
}

impl WriteAccess {
    pub fn new(clients: Arc<TemplateClients>) -> Self {
        Self {
            clients,
            answers: Mutex::new(Answers::default()),
        }
    }

    /// Whether `user` may write to the template's repository (asked of the forge, cached for
    /// [`ACCESS_TTL`]). A template without a token cannot ask: `false`.
    pub async fn has_write_access(
        &self,
        template: &PreviewTemplate,
        user: &str,
        user_id: Option<u64>,
    ) -> Result<bool, ForgeCallError> {
        let forge = &template.spec.forge;
        let key = (
            forge.kind,
            self.clients.api_url(forge).unwrap_or_default().to_string(),
            forge.repository.to_lowercase(),
            user.to_string(),
        );
        if let Some(answer) = self.lock().get(&key, Instant::now()) {
            return Ok(answer);
        }
        let Some(client) = self.clients.client(template).await? else {
            return Ok(false);
        };
        let answer = client
            .write_access(&forge.repository, user, user_id)
            .await?;
        self.lock().put(key, answer, Instant::now());
        Ok(answer)
    }

    /// The answers, even if a thread panicked holding them (each is a plain value).
    fn lock(&self) -> std::sync::MutexGuard<'_, Answers> {
        self.answers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(user: &str) -> AccessKey {
        (
            ForgeKind::Github,
            String::new(),
            "octo/app".into(),
            user.into(),
        )
    }

    #[test]
    fn an_answer_is_trusted_for_a_minute_then_asked_again() {
        let mut answers = Answers::default();
        let given = Instant::now();
        answers.put(key("octocat"), true, given);
        let after = |seconds| given + Duration::from_secs(seconds);
        assert_eq!(answers.get(&key("octocat"), after(59)), Some(true));
        assert_eq!(answers.get(&key("octocat"), after(60)), None, "asked again");
        assert_eq!(answers.get(&key("hubot"), given), None, "per user");
    }

    #[test]
    fn old_answers_are_dropped_when_a_new_one_is_kept() {
        let mut answers = Answers::default();
        let given = Instant::now();
        answers.put(key("octocat"), true, given);
        answers.put(key("monalisa"), true, given + Duration::from_secs(30));
        let later = given + Duration::from_secs(61);
        answers.put(key("hubot"), false, later);
        assert_eq!(
            answers.0.len(),
            2,
            "the memory holds only answers still in use"
        );
        assert_eq!(answers.get(&key("monalisa"), later), Some(true));
        assert_eq!(answers.get(&key("hubot"), later), Some(false));
    }
}
