//! What an engine rendered, by a digest of everything the render depends on (the chart or
//! overlay's files, the values, the release and namespace), so that a reconcile of an unchanged
//! commit runs no engine; and the published charts downloaded, by repository, name and version,
//! so that a new commit downloads nothing. Bounded by bytes, oldest out first.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

/// The most rendered text kept (every environment's latest render fits many times over:
/// the Online Boutique's chart renders about 40 KiB).
pub const CACHE_BYTES: usize = 64 << 20;

pub type RenderKey = [u8; 32];

/// Entries of type `T` (rendered text, a chart archive) by key.
pub struct RenderCache<T = String> {
    entries: Mutex<VecDeque<(RenderKey, Arc<T>)>>,
}

impl<T> Default for RenderCache<T> {
    fn default() -> Self {
        Self {
            entries: Mutex::default(),
        }
    }
}

impl<T: AsRef<[u8]>> RenderCache<T> {
    pub fn get(&self, key: &RenderKey) -> Option<Arc<T>> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, text)| text.clone())
    }

    pub fn keep(&self, key: RenderKey, text: Arc<T>) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|(k, _)| *k != key);
        entries.push_back((key, text));
        let size = |entry: &T| entry.as_ref().len();
        let mut total: usize = entries.iter().map(|(_, t)| size(t)).sum();
        while total > CACHE_BYTES {
            match entries.pop_front() {
                Some((_, dropped)) => total = total.saturating_sub(size(&dropped)),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_renders_by_key_and_drops_the_oldest_beyond_the_byte_bound() {
        let cache: RenderCache = RenderCache::default();
        let big = Arc::new("x".repeat(CACHE_BYTES / 2));
        cache.keep([1; 32], big.clone());
        cache.keep([2; 32], big.clone());
        assert!(cache.get(&[1; 32]).is_some() && cache.get(&[2; 32]).is_some());
        cache.keep([3; 32], Arc::new("y".into()));
        assert!(cache.get(&[1; 32]).is_none(), "the oldest went");
        assert_eq!(
            cache.get(&[3; 32]).as_deref().map(String::as_str),
            Some("y")
        );
        assert!(cache.get(&[9; 32]).is_none());
    }
}
