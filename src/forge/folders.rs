//! Reading a repository folder at a commit the way both forges let content be named by hash:
//! the forge's tree listing names each file's blob id (and, on GitHub, its size), and each file
//! is fetched by that id unless its content is already kept ([`BlobCache`]). A push that
//! changed nothing in the folder costs the listing alone; one that changed one file costs the
//! listing and that file.
//!
//! The files are code from the pull request, so the limits apply before anything is fetched
//! where the listing allows (the count; GitHub's sizes; the repository's reads this hour,
//! [`BlobCache::take_reads`]), and to each file and the running total as files are read:
//! reading stops at the first file past a limit.

use std::future::Future;
use std::sync::Arc;

use super::blobs::{BlobCache, BlobKey, ReadAt};
use super::limits::{check_listed_sizes, check_manifest_count, check_manifest_size, check_total};
use super::metrics::ForgeMetrics;
pub(crate) use super::seam::TreeFile;
use super::transport::ForgeApiError;

/// Whether `id` has the shape of a Git object id (40 hex digits for SHA-1, 64 for SHA-256).
/// Ids come from the forge's answer and go into a URL path: nothing else is used.
pub(crate) fn is_object_id(id: &str) -> bool {
    matches!(id.len(), 40 | 64) && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Where blobs are read: the cache, and the forge and repository its entries are kept for.
pub(crate) struct BlobSource<'a> {
    pub cache: &'a BlobCache,
    pub metrics: &'a ForgeMetrics,
    /// `github` or `gitlab`, for the metrics.
    pub forge: &'static str,
    /// The forge's API URL.
    pub origin: &'a str,
    pub repository: &'a str,
    /// The environment that reads (`namespace/name`), whose share of the repository's reads
    /// this reading spends.
    pub reader: &'a str,
}

/// Takes `count` reads at `at` from the reader's and the repository's hour, or says when
/// they fit ([`ForgeApiError::ReadShare`]).
pub(crate) fn take_reads(
    cache: &BlobCache,
    at: ReadAt<'_>,
    count: usize,
    now: std::time::Instant,
) -> Result<(), ForgeApiError> {
    cache
        .take_reads(at, count, now)
        .map_err(|wait| ForgeApiError::ReadShare {
            repository: at.repository.to_string(),
            reads: count,
            wait,
        })
}

/// [`BlobCache::take_listing`], or why not ([`ForgeApiError::ReadShare`]).
pub(crate) fn take_listing(
    cache: &BlobCache,
    at: ReadAt<'_>,
    listing: &str,
) -> Result<(), ForgeApiError> {
    cache
        .take_listing(at, listing, std::time::Instant::now())
        .map_err(|wait| ForgeApiError::ReadShare {
            repository: at.repository.to_string(),
            reads: 1,
            wait,
        })
}

impl BlobSource<'_> {
    fn read_at(&self) -> ReadAt<'_> {
        ReadAt {
            origin: self.origin,
            repository: self.repository,
            reader: self.reader,
        }
    }
}

/// The contents of `files` under folder `root`, as (path, bytes): kept blobs from the cache,
/// the others by `fetch` (given the file), each checked and then kept. The file count and
/// every listed size are checked before anything is fetched.
pub(crate) async fn read_blobs<F, Fut>(
    root: &str,
    files: Vec<TreeFile>,
    source: BlobSource<'_>,
    fetch: F,
) -> Result<Vec<(String, Vec<u8>)>, ForgeApiError>
where
    F: Fn(TreeFile) -> Fut,
    Fut: Future<Output = Result<Vec<u8>, ForgeApiError>>,
{
    check_manifest_count(root, files.len())?;
    let listed = files
        .iter()
        .filter_map(|file| Some((file.path.clone(), file.size?)));
    check_listed_sizes(root, listed)?;
    let unread = files
        .iter()
        .filter(|file| {
            let key = BlobKey::new(source.origin, source.repository, &file.blob);
            !source.cache.holds(&key)
        })
        .count();
    let taken_at = std::time::Instant::now();
    take_reads(source.cache, source.read_at(), unread, taken_at)?;
    let mut fetches = 0usize;
    let read = fetch_all(root, files, &source, fetch, &mut fetches).await;
    // Fewer reads than taken (a reading that stopped early, files listed twice under one id):
    // the rest are given back.
    let unmade = unread.saturating_sub(fetches);
    source
        .cache
        .give_back_reads(source.read_at(), unmade, taken_at);
    read
}

/// The files' contents, kept or fetched, counting the fetches in `fetches`.
async fn fetch_all<F, Fut>(
    root: &str,
    files: Vec<TreeFile>,
    source: &BlobSource<'_>,
    fetch: F,
    fetches: &mut usize,
) -> Result<Vec<(String, Vec<u8>)>, ForgeApiError>
where
    F: Fn(TreeFile) -> Fut,
    Fut: Future<Output = Result<Vec<u8>, ForgeApiError>>,
{
    let counted = |outcome: &str| {
        source
            .metrics
            .blobs
            .with_label_values(&[source.forge, outcome])
            .inc();
    };
    let mut total = 0usize;
    let mut read = Vec::with_capacity(files.len());
    for file in files {
        if !is_object_id(&file.blob) {
            return Err(ForgeApiError::Http {
                operation: "read_blob",
                status: 200,
                message: format!("{}: the forge's tree names no valid blob id", file.path),
            });
        }
        let key = BlobKey::new(source.origin, source.repository, &file.blob);
        let bytes = match source.cache.get(&key) {
            Some(kept) => {
                counted("kept");
                kept
            }
            None => {
                *fetches += 1;
                let fetched = fetch(file.clone()).await?;
                check_manifest_size(&file.path, fetched.len() as u64)?;
                counted("read");
                let fetched = Arc::new(fetched);
                source.cache.insert(key, fetched.clone());
                fetched
            }
        };
        total = total.saturating_add(bytes.len());
        // Stop at the first file past the total: the rest would be read for nothing.
        check_total(root, total)?;
        read.push((file.path, bytes.to_vec()));
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn file(path: &str, blob: char, size: Option<u64>) -> TreeFile {
        TreeFile {
            path: path.into(),
            blob: blob.to_string().repeat(40),
            size,
        }
    }

    /// Reads `files` with a fetch that records the ids it was asked for and answers `size`
    /// bytes for each.
    async fn read_recording(
        cache: &BlobCache,
        files: Vec<TreeFile>,
        size: usize,
    ) -> (Result<Vec<(String, Vec<u8>)>, ForgeApiError>, Vec<String>) {
        read_by("team/pr-1", cache, files, size).await
    }

    /// [`read_recording`] for `reader`; a blob id starting `dead` fails to fetch.
    async fn read_by(
        reader: &str,
        cache: &BlobCache,
        files: Vec<TreeFile>,
        size: usize,
    ) -> (Result<Vec<(String, Vec<u8>)>, ForgeApiError>, Vec<String>) {
        let fetched = Mutex::new(Vec::new());
        let metrics = ForgeMetrics::new();
        let source = BlobSource {
            cache,
            metrics: &metrics,
            forge: "github",
            origin: "https://api.github.com",
            repository: "octo/app",
            reader,
        };
        let result = read_blobs("chart", files, source, |file: TreeFile| {
            let fails = file.blob.starts_with("dead");
            fetched.lock().unwrap().push(file.blob);
            async move {
                match fails {
                    true => Err(ForgeApiError::Http {
                        operation: "read_blob",
                        status: 502,
                        message: "bad gateway".into(),
                    }),
                    false => Ok(vec![b'x'; size]),
                }
            }
        })
        .await;
        (result, fetched.into_inner().unwrap())
    }

    #[tokio::test]
    async fn a_blob_read_once_is_not_fetched_again_for_a_later_commit() {
        let cache = BlobCache::default();
        let first = vec![
            file("Chart.yaml", 'a', Some(3)),
            file("values.yaml", 'b', Some(3)),
        ];
        let (read, fetched) = read_recording(&cache, first, 3).await;
        assert_eq!(read.unwrap().len(), 2);
        assert_eq!(fetched.len(), 2);
        // The next commit changed values.yaml only: one fetch, Chart.yaml from the cache.
        let next = vec![
            file("Chart.yaml", 'a', Some(3)),
            file("values.yaml", 'c', Some(3)),
        ];
        let (read, fetched) = read_recording(&cache, next, 3).await;
        assert_eq!(fetched, ["c".repeat(40)]);
        let read = read.unwrap();
        assert_eq!(read[0], ("Chart.yaml".to_string(), b"xxx".to_vec()));
    }

    /// Each push of `reader`'s pull request rewrites the 200 files (ids never seen before).
    fn rewritten(push: usize) -> Vec<TreeFile> {
        (0..200)
            .map(|i| TreeFile {
                path: format!("{i}.yaml"),
                blob: format!("{:040x}", push * 1_000 + i + 1),
                size: Some(1),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_pull_request_rewriting_every_file_on_each_push_reads_its_share_and_no_more() {
        let cache = BlobCache::default();
        let (read, fetched) = read_by("team/busy", &cache, rewritten(0), 1).await;
        assert_eq!(read.unwrap().len(), 200);
        assert_eq!(fetched.len(), 200);
        let (read, fetched) = read_by("team/busy", &cache, rewritten(1), 1).await;
        let Err(ForgeApiError::ReadShare { reads, wait, .. }) = read else {
            panic!("the second push's files wait: {read:?}");
        };
        assert_eq!(reads, 200);
        assert!(wait > std::time::Duration::from_secs(3_000), "{wait:?}");
        assert!(fetched.is_empty(), "nothing fetched past the share");
        // A commit of files already kept costs no read and goes on.
        let (read, fetched) = read_by("team/busy", &cache, rewritten(0), 1).await;
        assert_eq!(read.unwrap().len(), 200);
        assert!(fetched.is_empty());
        // The repository's other pull requests read theirs: four more whole folders, and then
        // the repository's hour of 1,000 is spent.
        for (n, reader) in ["team/a", "team/b", "team/c", "team/d"]
            .into_iter()
            .enumerate()
        {
            let (read, _) = read_by(reader, &cache, rewritten(10 + n), 1).await;
            assert_eq!(
                read.unwrap().len(),
                200,
                "{reader} reads beside the busy one"
            );
        }
        let (read, _) = read_by("team/e", &cache, rewritten(20), 1).await;
        assert!(
            matches!(read, Err(ForgeApiError::ReadShare { .. })),
            "{read:?}"
        );
    }

    #[tokio::test]
    async fn reads_a_failed_reading_did_not_make_are_given_back() {
        let cache = BlobCache::default();
        // The third of 200 files fails: three reads were sent, 197 are given back.
        let mut failing = rewritten(0);
        failing[2].blob = format!("dead{}", "0".repeat(36));
        let (read, fetched) = read_by("team/pr", &cache, failing, 1).await;
        assert!(matches!(read, Err(ForgeApiError::Http { status: 502, .. })));
        assert_eq!(fetched.len(), 3);
        // 250 - 3 left: a whole new folder fits (it would not, had all 200 been kept).
        let (read, fetched) = read_by("team/pr", &cache, rewritten(1), 1).await;
        assert_eq!(read.unwrap().len(), 200);
        assert_eq!(fetched.len(), 200);
    }

    #[tokio::test]
    async fn listed_sizes_and_counts_are_refused_before_any_fetch() {
        let cache = BlobCache::default();
        let huge = vec![file("a.yaml", 'a', Some(5 << 20))];
        let (read, fetched) = read_recording(&cache, huge, 1).await;
        assert!(matches!(read, Err(ForgeApiError::ManifestsTooLarge { .. })));
        assert!(fetched.is_empty(), "fetched {fetched:?}");
        let many: Vec<_> = (0..201)
            .map(|i| file(&format!("{i}.yaml"), 'a', Some(1)))
            .collect();
        let (read, fetched) = read_recording(&cache, many, 1).await;
        assert!(matches!(read, Err(ForgeApiError::ManifestsTooLarge { .. })));
        assert!(fetched.is_empty());
    }

    #[tokio::test]
    async fn unlisted_sizes_stop_the_reading_at_the_first_file_past_a_limit() {
        // GitLab lists no sizes: ten files of 900 KiB, the fifth takes the total past 4 MiB.
        let cache = BlobCache::default();
        let heavy: Vec<_> = "0123456789"
            .chars()
            .map(|c| file(&format!("{c}.yaml"), c, None))
            .collect();
        let (read, fetched) = read_recording(&cache, heavy, 900 << 10).await;
        assert!(matches!(read, Err(ForgeApiError::ManifestsTooLarge { .. })));
        assert_eq!(fetched.len(), 5);
        // One file over 1 MiB, fetched (its size was not listed) and refused.
        let (read, _) = read_recording(&cache, vec![file("big.yaml", 'f', None)], 2 << 20).await;
        let said = read.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(said.contains("per manifest file"), "{said}");
    }

    #[tokio::test]
    async fn an_id_that_is_no_object_id_never_reaches_a_url() {
        let cache = BlobCache::default();
        let mut hostile = file("a.yaml", 'a', Some(1));
        hostile.blob = "../../user".into();
        let (read, fetched) = read_recording(&cache, vec![hostile], 1).await;
        assert!(read.is_err());
        assert!(fetched.is_empty());
    }
}
