//! Repository files kept by blob id. A forge names a file's content by its Git blob id, so what
//! was read for one id is what any commit with that id holds: a chart of 35 files costs one tree
//! listing for a new commit, plus one read per file whose content the commit changed.
//!
//! The cache is bounded by bytes (the least recently used blobs go first) and keyed by the
//! forge's API URL and the repository as well as the id: a blob is only ever served to a
//! reader of the same repository on the same forge, which had to list that repository's tree
//! (with its own token) to learn the id. Another team's template, pointing its `apiUrl` at a
//! server of its own, fills only its own entries.
//!
//! Reads the cache does not hold spend the forge's REST rate limit (GitHub: 5,000 an hour per
//! token or installation), which every repository of the token shares: a pull request that
//! rewrites 200 files on every push would spend it for all. So each repository may have
//! [`READS_PER_REPOSITORY_HOUR`] blobs read in an hour, and each environment a quarter of that
//! ([`READS_PER_READER_HOUR`], so that one busy pull request leaves its repository's other
//! ones room: [`BlobCache::take_reads`]); a commit whose new files do not fit waits, and the
//! commit deployed before keeps running. Reads taken and not made are given back.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Bytes of blobs kept at most. A chart is a few hundred KB; 64 MiB keeps the charts of many
/// repositories across their commits, and the limit on one folder (4 MiB) keeps one commit
/// from filling it.
pub const BLOB_CACHE_BYTES: usize = 64 << 20;

/// Blobs one repository may have read from its forge in an hour: a fifth of GitHub's 5,000,
/// five whole folders of the most files previewd reads (200). A push that changes a few files
/// costs a few.
pub const READS_PER_REPOSITORY_HOUR: usize = 1_000;
const HOUR: Duration = Duration::from_secs(3_600);
/// Blobs one reader (an environment) may have read in an hour: a quarter of its repository's,
/// more than one whole folder, so that any one commit fits, and it takes four pull requests
/// rewriting every file to spend their repository's hour.
pub const READS_PER_READER_HOUR: usize = READS_PER_REPOSITORY_HOUR / 4;
/// Repositories whose reads are remembered at once; beyond, those without a read this hour go.
const MAX_REPOSITORIES: usize = 4096;

/// One read taken: when, and by which reader.
type Read = (Instant, Arc<str>);

/// Who reads what: the forge's API URL, the repository and the reader (the environment, as
/// `namespace/name`), whose reads count against the repository's hour and the reader's share.
#[derive(Clone, Copy, Debug)]
pub struct ReadAt<'a> {
    pub origin: &'a str,
    pub repository: &'a str,
    pub reader: &'a str,
}

/// `Ok` when `count` more reads fit beside `taken` (oldest first) within `limit` an hour; else
/// how long until they do: the oldest read that must leave the hour first. More than `limit`
/// at once never fit, and wait a whole hour.
fn wait_for_room<'a>(
    taken: impl Iterator<Item = &'a Instant>,
    count: usize,
    limit: usize,
    now: Instant,
) -> Result<(), Duration> {
    let taken: Vec<&Instant> = taken.collect();
    let over = (taken.len() + count).saturating_sub(limit);
    if over == 0 {
        return Ok(());
    }
    let wait = over
        .checked_sub(1)
        .and_then(|index| taken.get(index))
        .map_or(HOUR, |oldest| {
            (**oldest + HOUR).saturating_duration_since(now)
        });
    Err(wait.max(Duration::from_secs(1)))
}

/// Where a blob was read: the forge's API URL and the repository (lower case: both forges
/// compare names so), and the blob id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlobKey {
    pub origin: String,
    pub repository: String,
    pub blob: String,
}

impl BlobKey {
    pub fn new(origin: &str, repository: &str, blob: &str) -> Self {
        Self {
            origin: origin.to_string(),
            repository: repository.to_lowercase(),
            blob: blob.to_string(),
        }
    }
}

/// What one entry costs beyond its content: its key and the maps' own bookkeeping. Counted so
/// that a forge answering with thousands of empty files cannot grow the cache without bound.
const ENTRY_OVERHEAD: usize = 128;

impl BlobKey {
    /// Bytes one entry of `content` bytes holds.
    fn cost(&self, content: usize) -> usize {
        content + self.origin.len() + self.repository.len() + self.blob.len() + ENTRY_OVERHEAD
    }
}

struct Kept {
    bytes: Arc<Vec<u8>>,
    /// When it was last read (a counter, not a clock): the smallest goes first.
    used: u64,
}

#[derive(Default)]
struct Blobs {
    kept: HashMap<BlobKey, Kept>,
    /// The keys by when they were last read, oldest first.
    by_use: BTreeMap<u64, BlobKey>,
    bytes: usize,
    clock: u64,
}

impl Blobs {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn remove(&mut self, key: &BlobKey) {
        if let Some(gone) = self.kept.remove(key) {
            self.by_use.remove(&gone.used);
            self.bytes -= key.cost(gone.bytes.len());
        }
    }
}

/// Blobs by [`BlobKey`], at most `capacity` bytes in all; and the reads of each repository
/// this hour.
pub struct BlobCache {
    capacity: usize,
    blobs: Mutex<Blobs>,
    /// When each read of the last hour was taken, by (forge API URL, repository).
    reads: Mutex<HashMap<(String, String), VecDeque<Read>>>,
    /// Listings charged this hour, by (forge API URL, repository, what was listed): listing a
    /// commit again (its reading no longer kept) is previewd's doing, not the reader's.
    listed: Mutex<HashMap<(String, String, String), Instant>>,
}

/// Listings remembered as charged at once; beyond, those older than an hour go (and if none
/// does, a listing is charged again: the safe side).
const MAX_LISTINGS: usize = 16_384;

impl Default for BlobCache {
    fn default() -> Self {
        Self::with_capacity(BLOB_CACHE_BYTES)
    }
}

impl BlobCache {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            capacity,
            blobs: Mutex::new(Blobs::default()),
            reads: Mutex::default(),
            listed: Mutex::default(),
        }
    }

    /// Whether `key` is kept (without counting as used).
    pub fn holds(&self, key: &BlobKey) -> bool {
        self.lock().kept.contains_key(key)
    }

    /// Takes `count` reads of repository `repository` on forge `origin` for `reader` (the
    /// environment that reads) at `now`, if the repository's hour and the reader's share of
    /// it allow them all; else says when they will.
    pub fn take_reads(&self, at: ReadAt<'_>, count: usize, now: Instant) -> Result<(), Duration> {
        if count == 0 {
            return Ok(());
        }
        let mut reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
        let recent = |(when, _): &Read| now.saturating_duration_since(*when) < HOUR;
        let key = (at.origin.to_string(), at.repository.to_lowercase());
        if !reads.contains_key(&key) && reads.len() >= MAX_REPOSITORIES {
            reads.retain(|_, taken| {
                taken.retain(recent);
                !taken.is_empty()
            });
        }
        let taken = reads.entry(key).or_default();
        taken.retain(recent);
        let all = taken.iter().map(|(when, _)| when);
        wait_for_room(all, count, READS_PER_REPOSITORY_HOUR, now)?;
        let readers = taken.iter().filter(|(_, who)| **who == *at.reader);
        wait_for_room(
            readers.map(|(when, _)| when),
            count,
            READS_PER_READER_HOUR,
            now,
        )?;
        let reader: Arc<str> = Arc::from(at.reader);
        taken.extend(std::iter::repeat_n((now, reader), count));
        Ok(())
    }

    /// Takes one read for listing `listing` (a tree, with how it is listed) at `at`, unless
    /// that listing was charged in the last hour: a commit listed again because its reading
    /// was no longer kept costs its reader nothing more.
    pub fn take_listing(
        &self,
        at: ReadAt<'_>,
        listing: &str,
        now: Instant,
    ) -> Result<(), Duration> {
        let key = (
            at.origin.to_string(),
            at.repository.to_lowercase(),
            listing.to_string(),
        );
        let recent = |when: &Instant| now.saturating_duration_since(*when) < HOUR;
        {
            let listed = self.listed.lock().unwrap_or_else(PoisonError::into_inner);
            if listed.get(&key).is_some_and(recent) {
                return Ok(());
            }
        }
        self.take_reads(at, 1, now)?;
        let mut listed = self.listed.lock().unwrap_or_else(PoisonError::into_inner);
        if listed.len() >= MAX_LISTINGS {
            listed.retain(|_, when| recent(when));
        }
        if listed.len() < MAX_LISTINGS {
            listed.insert(key, now);
        }
        Ok(())
    }

    /// Records `count` reads `at.reader` made at `now` without taking them first (the pages of
    /// a listing beyond its first, known only once listed): they count against the hour from
    /// now on, even past its end.
    pub fn record_reads(&self, at: ReadAt<'_>, count: usize, now: Instant) {
        if count == 0 {
            return;
        }
        let mut reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (at.origin.to_string(), at.repository.to_lowercase());
        let reader: Arc<str> = Arc::from(at.reader);
        let taken = reads.entry(key).or_default();
        taken.extend(std::iter::repeat_n((now, reader), count));
    }

    /// Gives back `count` of the reads `at.reader` took at `taken_at` and did not make (the
    /// reading stopped before them): only reads sent to the forge spend its rate limit.
    pub fn give_back_reads(&self, at: ReadAt<'_>, count: usize, taken_at: Instant) {
        let mut reads = self.reads.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (at.origin.to_string(), at.repository.to_lowercase());
        let Some(taken) = reads.get_mut(&key) else {
            return;
        };
        let mut left = count;
        taken.retain(|(when, who)| {
            let give_back = left > 0 && *when == taken_at && **who == *at.reader;
            left -= usize::from(give_back);
            !give_back
        });
    }

    /// The kept bytes of `key`, if any (it then counts as just used).
    pub fn get(&self, key: &BlobKey) -> Option<Arc<Vec<u8>>> {
        let mut blobs = self.lock();
        let now = blobs.tick();
        let kept = blobs.kept.get_mut(key)?;
        let before = std::mem::replace(&mut kept.used, now);
        let bytes = kept.bytes.clone();
        blobs.by_use.remove(&before);
        blobs.by_use.insert(now, key.clone());
        Some(bytes)
    }

    /// Keeps `bytes` for `key`, letting the least recently used blobs go to stay within the
    /// capacity. A blob larger than the whole capacity is not kept.
    pub fn insert(&self, key: BlobKey, bytes: Arc<Vec<u8>>) {
        let cost = key.cost(bytes.len());
        if cost > self.capacity {
            return;
        }
        let mut blobs = self.lock();
        blobs.remove(&key);
        let used = blobs.tick();
        blobs.by_use.insert(used, key.clone());
        blobs.kept.insert(key, Kept { bytes, used });
        blobs.bytes += cost;
        while blobs.bytes > self.capacity {
            let Some((_, oldest)) = blobs.by_use.pop_first() else {
                break;
            };
            if let Some(gone) = blobs.kept.remove(&oldest) {
                blobs.bytes -= oldest.cost(gone.bytes.len());
            }
        }
    }

    /// Bytes kept now, keys and bookkeeping included.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// The cache, even if a thread panicked holding it (every entry is whole).
    fn lock(&self) -> std::sync::MutexGuard<'_, Blobs> {
        self.blobs.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at<'a>(repository: &'a str, reader: &'a str) -> ReadAt<'a> {
        ReadAt {
            origin: "https://api.github.com",
            repository,
            reader,
        }
    }

    #[test]
    fn a_repository_reads_at_most_its_hour_and_others_are_not_held_by_it() {
        let cache = BlobCache::default();
        let now = Instant::now();
        for pr in ["pr-1", "pr-2", "pr-3", "pr-4"] {
            cache.take_reads(at("org/busy", pr), 250, now).unwrap();
        }
        let wait = cache
            .take_reads(at("Org/Busy", "pr-5"), 1, now)
            .unwrap_err();
        assert_eq!(wait, HOUR, "names compare without case");
        cache.take_reads(at("org/quiet", "pr-1"), 200, now).unwrap();
        let later = now + HOUR;
        cache
            .take_reads(at("org/busy", "pr-5"), 200, later)
            .unwrap();
        assert_eq!(
            cache
                .take_reads(at("org/other", "pr-1"), 1_001, now)
                .unwrap_err(),
            HOUR
        );
    }

    #[test]
    fn one_reader_reads_at_most_its_share_and_leaves_its_repository_the_rest() {
        let cache = BlobCache::default();
        let now = Instant::now();
        cache.take_reads(at("org/app", "busy"), 200, now).unwrap();
        let soon = now + Duration::from_secs(60);
        let wait = cache
            .take_reads(at("org/app", "busy"), 200, soon)
            .unwrap_err();
        assert_eq!(
            wait,
            HOUR - Duration::from_secs(60),
            "its oldest reads leave first"
        );
        cache.take_reads(at("org/app", "busy"), 50, soon).unwrap();
        // The repository's other pull requests still read.
        cache.take_reads(at("org/app", "quiet"), 200, soon).unwrap();
    }

    #[test]
    fn a_listing_is_charged_once_an_hour() {
        let cache = BlobCache::default();
        let now = Instant::now();
        cache.take_reads(at("org/app", "pr-1"), 249, now).unwrap();
        cache
            .take_listing(at("org/app", "pr-1"), "c0ffee?recursive=1", now)
            .unwrap();
        // Listed again (its reading no longer kept): nothing more to pay.
        let again = now + Duration::from_secs(600);
        cache
            .take_listing(at("org/app", "pr-1"), "c0ffee?recursive=1", again)
            .unwrap();
        let new_commit = cache.take_listing(at("org/app", "pr-1"), "beef?recursive=1", again);
        assert!(new_commit.is_err(), "a new commit's listing is a read");
        let an_hour_on = now + HOUR;
        cache
            .take_listing(at("org/app", "pr-1"), "c0ffee?recursive=1", an_hour_on)
            .unwrap();
    }

    #[test]
    fn reads_given_back_are_taken_again() {
        let cache = BlobCache::default();
        let now = Instant::now();
        cache.take_reads(at("org/app", "pr-1"), 250, now).unwrap();
        assert!(cache.take_reads(at("org/app", "pr-1"), 1, now).is_err());
        // Another reader's reads of the same moment are not its to give back.
        cache.take_reads(at("org/app", "pr-2"), 10, now).unwrap();
        cache.give_back_reads(at("org/app", "pr-1"), 100, now);
        cache.take_reads(at("org/app", "pr-1"), 100, now).unwrap();
        assert!(cache.take_reads(at("org/app", "pr-1"), 1, now).is_err());
        cache.take_reads(at("org/app", "pr-2"), 240, now).unwrap();
        assert!(cache.take_reads(at("org/app", "pr-2"), 1, now).is_err());
    }

    fn key(blob: &str) -> BlobKey {
        BlobKey::new("https://api.github.com", "Octo/App", blob)
    }

    fn bytes(n: usize) -> Arc<Vec<u8>> {
        Arc::new(vec![b'x'; n])
    }

    #[test]
    fn the_least_recently_used_blob_goes_first_and_the_bytes_stay_within_the_capacity() {
        let entry = key("a").cost(40);
        let cache = BlobCache::with_capacity(2 * entry + 10);
        cache.insert(key("a"), bytes(40));
        cache.insert(key("b"), bytes(40));
        // `a` read again: `b` is now the least recently used.
        assert!(cache.get(&key("a")).is_some());
        cache.insert(key("c"), bytes(40));
        assert!(cache.get(&key("b")).is_none(), "b went");
        assert!(cache.get(&key("a")).is_some() && cache.get(&key("c")).is_some());
        assert_eq!(cache.bytes(), 2 * entry);
        // Larger than the whole capacity: not kept, nothing else lost.
        cache.insert(key("huge"), bytes(2 * entry));
        assert!(cache.get(&key("huge")).is_none());
        assert_eq!(cache.bytes(), 2 * entry);
        // The same key again replaces its entry, counted once.
        cache.insert(key("a"), bytes(40));
        assert_eq!(cache.bytes(), 2 * entry);
    }

    #[test]
    fn empty_blobs_count_too_so_a_forge_of_empty_files_cannot_grow_the_cache() {
        let cache = BlobCache::with_capacity(64 << 10);
        for n in 0..100_000 {
            cache.insert(key(&format!("{n:040x}")), Arc::new(Vec::new()));
        }
        assert!(cache.bytes() <= 64 << 10, "{} bytes", cache.bytes());
        assert!(cache.get(&key(&format!("{:040x}", 99_999))).is_some());
        assert!(cache.get(&key(&format!("{:040x}", 0))).is_none());
    }

    #[test]
    fn a_blob_is_kept_per_forge_and_repository_not_by_id_alone() {
        // Another template's `apiUrl` (a server of its own) answering with the same id fills
        // its own entry, never the one a real forge's reader gets.
        let cache = BlobCache::default();
        cache.insert(key("1234"), Arc::new(b"real".to_vec()));
        let elsewhere = BlobKey::new("http://127.0.0.1:9", "octo/app", "1234");
        cache.insert(elsewhere.clone(), Arc::new(b"forged".to_vec()));
        assert_eq!(cache.get(&key("1234")).unwrap().as_slice(), b"real");
        assert_eq!(cache.get(&elsewhere).unwrap().as_slice(), b"forged");
        let other_repository = BlobKey::new("https://api.github.com", "other/app", "1234");
        assert!(cache.get(&other_repository).is_none());
        // Repository names compare without case, as the forges compare them.
        let same = BlobKey::new("https://api.github.com", "octo/app", "1234");
        assert_eq!(cache.get(&same).unwrap().as_slice(), b"real");
    }
}
