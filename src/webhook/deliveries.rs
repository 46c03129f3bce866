//! Delivery dedupe: the forge's "Redeliver" button, or its retry after a timeout, sends the
//! same delivery id again; it is answered without writing anything twice.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};

/// How many delivery ids are remembered to drop redeliveries.
const REMEMBERED_DELIVERIES: usize = 10_000;

/// Delivery ids being handled or handled recently: a redelivery (the forge's "Redeliver"
/// button, or a retry after a timeout) changes nothing twice. Bounded: the oldest are dropped.
#[derive(Default)]
pub struct DeliveryLog {
    inner: Mutex<(HashSet<String>, VecDeque<String>)>,
}

impl DeliveryLog {
    /// Records `id`; false if it was already there.
    pub fn begin(&self, id: &str) -> bool {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (seen, order) = &mut *guard;
        if !seen.insert(id.to_string()) {
            return false;
        }
        order.push_back(id.to_string());
        while order.len() > REMEMBERED_DELIVERIES {
            if let Some(oldest) = order.pop_front() {
                seen.remove(&oldest);
            }
        }
        true
    }

    pub fn forget(&self, id: &str) {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (seen, order) = &mut *guard;
        seen.remove(id);
        order.retain(|d| d != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delivery_log_remembers_a_bounded_number_of_ids() {
        let log = DeliveryLog::default();
        assert!(log.begin("a"));
        assert!(!log.begin("a"));
        log.forget("a");
        assert!(log.begin("a"));
        for i in 0..REMEMBERED_DELIVERIES {
            assert!(log.begin(&i.to_string()));
        }
        assert!(log.begin("a"), "the oldest id was dropped");
    }
}
