//! Repository files kept by blob id. A forge names a file's content by its Git blob id, so what
//! was read for one id is what any commit with that id holds: a chart of 35 files costs one tree
//! listing for a new commit, plus one read per file whose content the commit changed.
//!
//! The cache is bounded by bytes (the least recently used blobs go first) and keyed by the
//! forge's API URL and the repository as well as the id: a blob is only ever served to a
//! reader of the same repository on the same forge, which had to list that repository's tree
//! (with its own token) to learn the id. Another team's template, pointing its `apiUrl` at a
//! server of its own, fills only its own entries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Bytes of blobs kept at most. A chart is a few hundred KB; 64 MiB keeps the charts of many
/// repositories across their commits, and the limit on one folder (4 MiB) keeps one commit
/// from filling it.
pub const BLOB_CACHE_BYTES: usize = 64 << 20;

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

struct Kept {
    bytes: Arc<Vec<u8>>,
    /// When it was last read (a counter, not a clock): the smallest goes first.
    used: u64,
}

#[derive(Default)]
struct Blobs {
    kept: HashMap<BlobKey, Kept>,
    bytes: usize,
    clock: u64,
}

/// Blobs by [`BlobKey`], at most `capacity` bytes in all.
pub struct BlobCache {
    capacity: usize,
    blobs: Mutex<Blobs>,
}

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
        }
    }

    /// The kept bytes of `key`, if any (it then counts as just used).
    pub fn get(&self, key: &BlobKey) -> Option<Arc<Vec<u8>>> {
        let mut blobs = self.lock();
        blobs.clock += 1;
        let now = blobs.clock;
        let kept = blobs.kept.get_mut(key)?;
        kept.used = now;
        Some(kept.bytes.clone())
    }

    /// Keeps `bytes` for `key`, letting the least recently used blobs go to stay within the
    /// capacity. A blob larger than the whole capacity is not kept.
    pub fn insert(&self, key: BlobKey, bytes: Arc<Vec<u8>>) {
        if bytes.len() > self.capacity {
            return;
        }
        let mut blobs = self.lock();
        blobs.clock += 1;
        let used = blobs.clock;
        let size = bytes.len();
        if let Some(previous) = blobs.kept.insert(key, Kept { bytes, used }) {
            blobs.bytes -= previous.bytes.len();
        }
        blobs.bytes += size;
        while blobs.bytes > self.capacity {
            let Some(oldest) = blobs
                .kept
                .iter()
                .min_by_key(|(_, kept)| kept.used)
                .map(|(key, _)| key.clone())
            else {
                break;
            };
            if let Some(gone) = blobs.kept.remove(&oldest) {
                blobs.bytes -= gone.bytes.len();
            }
        }
    }

    /// Bytes kept now.
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

    fn key(blob: &str) -> BlobKey {
        BlobKey::new("https://api.github.com", "Octo/App", blob)
    }

    fn bytes(n: usize) -> Arc<Vec<u8>> {
        Arc::new(vec![b'x'; n])
    }

    #[test]
    fn the_least_recently_used_blob_goes_first_and_the_bytes_stay_within_the_capacity() {
        let cache = BlobCache::with_capacity(100);
        cache.insert(key("a"), bytes(40));
        cache.insert(key("b"), bytes(40));
        // `a` read again: `b` is now the least recently used.
        assert!(cache.get(&key("a")).is_some());
        cache.insert(key("c"), bytes(40));
        assert!(cache.get(&key("b")).is_none(), "b went");
        assert!(cache.get(&key("a")).is_some() && cache.get(&key("c")).is_some());
        assert_eq!(cache.bytes(), 80);
        // Larger than the whole capacity: not kept, nothing else lost.
        cache.insert(key("huge"), bytes(101));
        assert!(cache.get(&key("huge")).is_none());
        assert_eq!(cache.bytes(), 80);
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
