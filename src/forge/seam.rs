//! The one seam between previewd and a forge: what previewd asks of a forge's API
//! ([`ForgeApi`]), how the forge's webhook deliveries are told apart and read
//! ([`WebhookDescriptor`]), and the few pure facts the reporter plans with ([`Forge`]). Each
//! forge's folder (`github/`, `gitlab/`) fills these in; [`super::forges`] lists the forges.
//! Nothing outside a forge's folder names that forge's types.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::blobs::BlobCache;
use super::limits::is_yaml;
use super::metrics::ForgeMetrics;
use super::transport::ForgeApiError;
use super::vocabulary::{CommentAuthor, DeployUpdate, Retire, StatusUpdate};
use super::{ForgeEvent, ParseError, SignatureError};
use crate::model::crd::{ForgeKind, ForgeReport, PreviewEnvironment};

/// A forge's answer, to be awaited (a boxed future keeps [`ForgeApi`] usable as `dyn`).
pub type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, ForgeApiError>> + Send + 'a>>;

/// A file of the tree under the folder being read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeFile {
    /// Relative to the folder read (or the file's name, when the path named one file).
    pub path: String,
    /// The forge's id of its content.
    pub blob: String,
    /// Its size as the listing gives it (GitHub's does; GitLab's tree gives none).
    pub size: Option<u64>,
}

/// What a commit's tree holds at a path.
#[derive(Debug)]
pub enum AtPath {
    /// A folder: every regular file under it (to the depth listed), paths relative to it.
    Folder(Vec<TreeFile>),
    /// One regular file, by its name.
    File(TreeFile),
    Missing,
}

/// How deep a listing goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// The folder's own files; a path that names one file answers [`AtPath::File`].
    OneLevel,
    /// Every file below the folder, paths relative to it; a file is not looked for.
    Every,
}

/// What previewd asks of a forge's API. Every call counts against the client's rate limit and
/// backoff; reads count against the reader's and the repository's hour ([`super::blobs`]).
pub trait ForgeApi: Send + Sync {
    /// Whose reads these are ([`super::client::ForgeClient::scope`]).
    fn scope(&self) -> &str;

    /// The id of previewd's own comment on request `number` whose text starts with `marker`.
    fn find_comment<'a>(
        &'a self,
        repository: &'a str,
        number: u64,
        marker: &'a str,
    ) -> Answer<'a, Option<u64>>;

    fn create_comment<'a>(
        &'a self,
        repository: &'a str,
        number: u64,
        body: &'a str,
    ) -> Answer<'a, u64>;

    /// Edits comment `id` on request `number`.
    fn edit_comment<'a>(
        &'a self,
        repository: &'a str,
        number: u64,
        id: u64,
        body: &'a str,
    ) -> Answer<'a, ()>;

    /// What commit `sha` holds at `path` (trimmed of slashes), listed to `depth`: one read of
    /// `reader`'s share, or more where the forge pages its listings.
    fn list_path<'a>(&'a self, at: Listing<'a>, depth: Depth) -> Answer<'a, AtPath>;

    /// The content of `files` (listed under `at.path`), from the blob cache or the forge.
    fn read_files<'a>(
        &'a self,
        at: Listing<'a>,
        files: Vec<TreeFile>,
    ) -> Answer<'a, Vec<(String, Vec<u8>)>>;

    /// Numbers of the open pull/merge requests of `repository`.
    fn open_requests<'a>(&'a self, repository: &'a str) -> Answer<'a, HashSet<u64>>;

    /// Names of the branches of `repository`.
    fn branches<'a>(&'a self, repository: &'a str) -> Answer<'a, HashSet<String>>;

    /// Whether `user` (or the user with id `user_id`, where the forge names users by id) may
    /// write to `repository`. Not a member: `false`.
    fn write_access<'a>(
        &'a self,
        repository: &'a str,
        user: &'a str,
        user_id: Option<u64>,
    ) -> Answer<'a, bool>;

    fn commit_status<'a>(&'a self, repository: &'a str, status: &'a StatusUpdate)
    -> Answer<'a, ()>;

    /// The forge's own record of the environment's head (a deployment, an environment),
    /// with the ids it gives back written to `record`.
    fn deploy<'a>(
        &'a self,
        environment: &'a PreviewEnvironment,
        update: &'a DeployUpdate,
        record: &'a mut ForgeReport,
    ) -> Answer<'a, ()>;

    /// Ends the forge's own record of a removed environment.
    fn retire<'a>(&'a self, repository: &'a str, retire: &'a Retire) -> Answer<'a, ()>;

    /// The YAML files directly in folder `at.path` (or the one file it names), as (file
    /// name, text): one listing, then one read per file whose blob is not kept.
    fn read_manifests<'a>(&'a self, at: Listing<'a>) -> Answer<'a, Vec<(String, String)>> {
        Box::pin(async move {
            let files: Vec<TreeFile> = match self.list_path(at, Depth::OneLevel).await? {
                AtPath::Folder(files) => files
                    .into_iter()
                    .filter(|file| !file.path.contains('/') && is_yaml(&file.path))
                    .collect(),
                AtPath::File(file) => [file].into_iter().filter(|f| is_yaml(&f.path)).collect(),
                AtPath::Missing => {
                    return Err(ForgeApiError::NotInRepository {
                        path: at.path.to_string(),
                    });
                }
            };
            let read = self.read_files(at, files).await?;
            Ok(read
                .into_iter()
                .map(|(name, bytes)| (name, String::from_utf8_lossy(&bytes).into_owned()))
                .collect())
        })
    }

    /// Every file under folder `at.path`, as (path relative to the folder, bytes): one
    /// listing of every level, then one read per file whose blob is not kept.
    fn read_folder<'a>(&'a self, at: Listing<'a>) -> Answer<'a, Vec<(String, Vec<u8>)>> {
        Box::pin(async move {
            match self.list_path(at, Depth::Every).await? {
                AtPath::Folder(files) => self.read_files(at, files).await,
                AtPath::File(_) | AtPath::Missing => Err(ForgeApiError::NotAFolder {
                    path: at.path.to_string(),
                }),
            }
        })
    }
}

/// A path of a repository at one commit, and whose reads listing and reading it spend.
#[derive(Clone, Copy, Debug)]
pub struct Listing<'a> {
    pub repository: &'a str,
    /// Trimmed of slashes; `""` is the repository's root.
    pub path: &'a str,
    pub sha: &'a str,
    /// The environment reading (`<namespace>/<name>`), whose share of reads is spent.
    pub reader: &'a str,
}

impl<'a> Listing<'a> {
    pub fn new(repository: &'a str, path: &'a str, sha: &'a str, reader: &'a str) -> Self {
        Self {
            repository,
            path: path.trim_matches('/'),
            sha,
            reader,
        }
    }
}

/// What a client of a forge is built from ([`super::client::ForgeClients`]).
pub struct Connect {
    /// The template's `forge.apiUrl` (or the sandbox's default); `None`: the public forge.
    pub api_url: Option<String>,
    pub token: String,
    /// Whose rate limit the client spends (`token`, `installation-<id>`).
    pub budget: String,
    pub author: CommentAuthor,
    pub metrics: ForgeMetrics,
    /// Repository files by blob id, shared by every client.
    pub blobs: Arc<BlobCache>,
    /// Whose reads the client makes.
    pub scope: String,
}

/// Checks a delivery against one webhook secret: (secret, body, the signature header).
pub type Verify = fn(&[u8], &[u8], Option<&str>) -> Result<(), SignatureError>;

/// How a forge's webhook deliveries are received: where, with which headers, verified and
/// parsed how. All pure: nothing here calls anything.
pub struct WebhookDescriptor {
    /// The route previewd serves the forge's deliveries on.
    pub path: &'static str,
    pub event_header: &'static str,
    pub delivery_header: &'static str,
    /// The header carrying the signature or token [`Self::verify`] checks.
    pub signature_header: &'static str,
    /// Whether verifying hashes the body (then it costs in proportion to the body's size).
    pub hashes_body: bool,
    /// Checks the delivery against one webhook secret: (secret, body, signature header).
    pub verify: Verify,
    /// The delivery as a [`ForgeEvent`]: (event header, body).
    pub parse: fn(&str, &[u8]) -> Result<ForgeEvent, ParseError>,
    /// Where the delivery names its repository, as JSON keys from the top.
    pub repository_field: &'static [&'static str],
    /// The event header as a metric label: one of a fixed set (the header is the sender's).
    pub event_label: fn(&str) -> &'static str,
}

impl WebhookDescriptor {
    /// The repository a delivery is about, read before verification only to find whose
    /// webhook secret applies. Nothing is acted on until the signature is checked.
    /// The body is checked whole for syntax, but not built: only the path's keys are compared.
    pub fn repository_of(&self, body: &[u8]) -> Result<Option<String>, ParseError> {
        super::json_path::string_at(body, self.repository_field).map_err(|source| {
            ParseError::Json {
                event: "webhook".into(),
                source,
            }
        })
    }
}

/// One forge, whole: its webhook, how to build its client, and what its reports cost.
pub struct Forge {
    pub kind: ForgeKind,
    pub webhook: WebhookDescriptor,
    /// A client of the forge's API (makes no call: a wrong token shows on the first one).
    pub connect: fn(Connect) -> Answer<'static, Box<dyn ForgeApi>>,
    /// The content-creating requests [`ForgeApi::deploy`] will make for `update`, given what
    /// `record` says was sent and the head commit (the content budget counts them first).
    pub deploy_requests: fn(&DeployUpdate, &ForgeReport, &str) -> Vec<&'static str>,
    /// How the forge's record of a removed environment ends, from what was sent.
    pub retire: fn(&ForgeReport) -> Option<Retire>,
}

#[cfg(test)]
mod tests {
    use super::super::forges::forge;
    use crate::model::crd::ForgeKind;

    #[test]
    fn repository_is_found_where_each_forge_puts_it() {
        let github = br#"{"repository": {"full_name": "Codertocat/Hello-World"}}"#;
        let gitlab = br#"{"project": {"path_with_namespace": "group/sub/app"}}"#;
        let (on_github, on_gitlab) = (
            &forge(ForgeKind::Github).webhook,
            &forge(ForgeKind::Gitlab).webhook,
        );
        assert_eq!(
            on_github.repository_of(github).unwrap().as_deref(),
            Some("Codertocat/Hello-World")
        );
        assert_eq!(
            on_gitlab.repository_of(gitlab).unwrap().as_deref(),
            Some("group/sub/app")
        );
        assert_eq!(on_github.repository_of(b"{}").unwrap(), None);
        assert!(on_github.repository_of(b"{not json").is_err());
    }

    /// The repository read before verification picks whose secret verifies a delivery; the
    /// parse after it names the repository acted on. A body naming its repository twice could
    /// make them differ, so the parse refuses it, on either forge, at either level of the path.
    #[test]
    fn a_delivery_naming_its_repository_twice_is_refused_by_the_parse() {
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures");
        let cases = [
            (
                ForgeKind::Github,
                "github/pull_request.opened.json",
                "pull_request",
            ),
            (
                ForgeKind::Gitlab,
                "gitlab/merge_request.json",
                "Merge Request Hook",
            ),
        ];
        for (kind, file, event_type) in cases {
            let webhook = &forge(kind).webhook;
            let body = std::fs::read(fixtures.join(file)).unwrap();
            let (outer, inner) = (webhook.repository_field[0], webhook.repository_field[1]);
            assert!((webhook.parse)(event_type, &body).is_ok(), "{file} parses");
            let text = String::from_utf8(body).unwrap();
            let twice_outer =
                text.replacen('{', &format!("{{\"{outer}\": {{\"{inner}\": \"x/y\"}},"), 1);
            let twice_inner = text.replacen(
                &format!("\"{outer}\": {{"),
                &format!("\"{outer}\": {{\"{inner}\": \"x/y\","),
                1,
            );
            for twice in [twice_outer, twice_inner] {
                assert_ne!(
                    webhook.repository_of(twice.as_bytes()).unwrap().as_deref(),
                    Some("x/y"),
                    "the fixture's own comes last"
                );
                let refused = (webhook.parse)(event_type, twice.as_bytes());
                let error = refused.err().map(|e| format!("{e:?}")).unwrap_or_default();
                assert!(error.contains("duplicate field"), "{file}: {error}");
            }
        }
    }

    #[test]
    fn every_forge_has_its_own_webhook_path() {
        let paths: std::collections::HashSet<_> = super::super::forges::all()
            .map(|f| f.webhook.path)
            .collect();
        assert_eq!(paths.len(), ForgeKind::ALL.len());
        for kind in ForgeKind::ALL {
            assert_eq!(forge(kind).kind, kind);
            assert_eq!(
                forge(kind).webhook.path,
                format!("/webhooks/{}", kind.as_str())
            );
        }
    }
}
