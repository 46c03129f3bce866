//! Who is asking: the client address a request is counted under (the gate's wakes, the
//! webhook endpoint's turns), and each client's share of what all clients share.
//!
//! previewd's listeners sit behind an ingress controller or gateway, so the connection's peer
//! is that proxy; the address it saw is the last one it added to `X-Forwarded-For`. Only a
//! proxy previewd trusts (`--gate-trusted-proxies`, `--webhook-trusted-proxies`, by default the
//! private and loopback ranges: a cluster's pods and nodes) may say who the client is, so the
//! header is read from its right end, hop by hop, while each hop is trusted; the first address
//! that is not is the client. A header from anyone else is ignored (anyone can write one), and
//! so is an entry that is no address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use http::HeaderMap;
use ipnet::IpNet;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The forwarded-for header ingress controllers and gateways add to.
const FORWARDED_FOR: &str = "x-forwarded-for";

/// The ranges trusted to say who the client is when none are configured: private (RFC 1918,
/// RFC 4193), shared (RFC 6598, where some clusters put pods) and loopback addresses.
pub const DEFAULT_TRUSTED_PROXIES: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "fc00::/7",
    "::1/128",
];

/// Parses `--gate-trusted-proxies`: a JSON list of networks (`10.0.0.0/8`) or addresses.
pub fn parse_trusted_proxies(text: &str) -> Result<Vec<IpNet>, String> {
    let entries: Vec<String> = serde_json::from_str(text)
        .map_err(|e| format!("expected a JSON list of networks, e.g. [\"10.0.0.0/8\"]: {e}"))?;
    entries.iter().map(|entry| network(entry)).collect()
}

fn network(entry: &str) -> Result<IpNet, String> {
    entry
        .parse::<IpNet>()
        .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{entry:?} is neither a network (10.0.0.0/8) nor an address"))
}

/// [`DEFAULT_TRUSTED_PROXIES`], parsed.
pub fn default_trusted_proxies() -> Vec<IpNet> {
    DEFAULT_TRUSTED_PROXIES
        .iter()
        .filter_map(|entry| entry.parse().ok())
        .collect()
}

/// Whether `address` is one of the `trusted` proxies'.
pub fn is_trusted(address: IpAddr, trusted: &[IpNet]) -> bool {
    let address = address.to_canonical();
    trusted.iter().any(|net| net.contains(&address))
}

/// The client of a request that came from `peer` with `headers`.
pub fn client_address(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |address: &IpAddr| is_trusted(*address, trusted);
    let mut client = peer.to_canonical();
    if !is_trusted(&client) {
        return client;
    }
    let hops: Vec<&str> = headers
        .get_all(FORWARDED_FOR)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .collect();
    for hop in hops.iter().rev() {
        let Ok(address) = hop.trim().parse::<IpAddr>() else {
            return client;
        };
        client = address;
        if !is_trusted(&client) {
            return client;
        }
    }
    client
}

/// The address a client is counted under: itself, or the /64 of an IPv6 address (one host
/// usually holds a whole /64, and rotating addresses inside it must not buy more); an IPv4
/// address mapped into IPv6 (a dual-stack listener's view of an IPv4 peer) counts as itself.
pub fn counted_as(client: IpAddr) -> IpAddr {
    match client.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(prefix.into())
        }
    }
}

/// Each client's share of something all clients share (connections, turns): at most
/// `per_client` held by one client (as [`counted_as`] counts it) at once, so that one client,
/// however many requests it opens, leaves the rest to the others. The whole is bounded by its
/// own semaphore; this bounds each client's part of it.
pub struct ClientShares {
    per_client: usize,
    /// Per client in flight: its semaphore, and how many shares are held or waited for. An
    /// entry goes when that count reaches 0, so the map holds only clients in flight.
    held: Mutex<HashMap<IpAddr, (Arc<Semaphore>, usize)>>,
}

/// One share (or a wait for one), until dropped: then the client's count goes down, and its
/// entry with the last.
pub struct ClientShare {
    permit: Option<OwnedSemaphorePermit>,
    client: IpAddr,
    shares: Arc<ClientShares>,
}

impl ClientShares {
    /// At most `per_client` shares per client address (at least one).
    pub fn new(per_client: usize) -> Arc<Self> {
        Arc::new(Self {
            per_client: per_client.clamp(1, Semaphore::MAX_PERMITS),
            held: Mutex::default(),
        })
    }

    pub fn per_client(&self) -> usize {
        self.per_client
    }

    /// A share for `client` if it holds fewer than its bound now; `None` otherwise.
    pub fn try_take(self: &Arc<Self>, client: IpAddr) -> Option<ClientShare> {
        let (mut share, semaphore) = self.enter(client);
        share.permit = Some(semaphore.try_acquire_owned().ok()?);
        Some(share)
    }

    /// A share for `client`, waiting until one of its own ends; `None` after `wait`. Dropped
    /// while waiting (its request gone), it leaves nothing behind.
    pub async fn take_within(
        self: &Arc<Self>,
        client: IpAddr,
        wait: std::time::Duration,
    ) -> Option<ClientShare> {
        let (mut share, semaphore) = self.enter(client);
        let permit = tokio::time::timeout(wait, semaphore.acquire_owned()).await;
        share.permit = Some(permit.ok()?.ok()?);
        Some(share)
    }

    /// Counts `client` in (its entry made if it has none) and hands out its guard, which
    /// counts it out when dropped, whatever happens meanwhile.
    fn enter(self: &Arc<Self>, client: IpAddr) -> (ClientShare, Arc<Semaphore>) {
        let client = counted_as(client);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let (semaphore, users) = held
            .entry(client)
            .or_insert_with(|| (Arc::new(Semaphore::new(self.per_client)), 0));
        *users += 1;
        let share = ClientShare {
            permit: None,
            client,
            shares: self.clone(),
        };
        (share, semaphore.clone())
    }

    /// Clients holding or waiting for a share now (for tests and metrics).
    pub fn clients_in_flight(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for ClientShare {
    fn drop(&mut self) {
        drop(self.permit.take());
        let mut held = self
            .shares
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((_, users)) = held.get_mut(&self.client) {
            *users = users.saturating_sub(1);
            if *users == 0 {
                held.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(FORWARDED_FOR, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn a_trusted_proxy_says_who_the_client_is_and_nobody_else_does() {
        let trusted = default_trusted_proxies();
        let via_ingress = forwarded(&["203.0.113.9"]);
        assert_eq!(
            client_address(ip("10.1.2.3"), &via_ingress, &trusted),
            ip("203.0.113.9")
        );
        // Straight from the internet, a header is the client's own word: ignored.
        let forged = forwarded(&["198.51.100.1"]);
        assert_eq!(
            client_address(ip("203.0.113.9"), &forged, &trusted),
            ip("203.0.113.9")
        );
        // What the client wrote before the proxy added its view is never reached.
        let prefixed = forwarded(&["198.51.100.1, 198.51.100.2", "203.0.113.9"]);
        assert_eq!(
            client_address(ip("10.1.2.3"), &prefixed, &trusted),
            ip("203.0.113.9")
        );
        // Through two trusted hops, the first untrusted address from the right.
        let chained = forwarded(&["203.0.113.9, 10.0.0.5"]);
        assert_eq!(
            client_address(ip("10.1.2.3"), &chained, &trusted),
            ip("203.0.113.9")
        );
        // No header, or a hop that is no address: the last trusted hop is all there is.
        assert_eq!(
            client_address(ip("10.1.2.3"), &HeaderMap::new(), &trusted),
            ip("10.1.2.3")
        );
        let junk = forwarded(&["unknown"]);
        assert_eq!(
            client_address(ip("10.1.2.3"), &junk, &trusted),
            ip("10.1.2.3")
        );
    }

    #[test]
    fn trusted_proxies_are_networks_or_addresses() {
        let parsed =
            parse_trusted_proxies(r#"["10.0.0.0/8", "192.0.2.7", "2001:db8::/32"]"#).unwrap();
        assert_eq!(parsed.len(), 3);
        assert!(parsed[1].contains(&ip("192.0.2.7")));
        assert!(parse_trusted_proxies(r#"["10.0.0.0/33"]"#).is_err());
        assert!(parse_trusted_proxies("10.0.0.0/8").is_err());
        assert_eq!(
            default_trusted_proxies().len(),
            DEFAULT_TRUSTED_PROXIES.len()
        );
    }
    #[tokio::test]
    async fn one_client_holds_at_most_its_share_and_the_others_theirs() {
        let shares = ClientShares::new(2);
        let (greedy, other) = (ip("203.0.113.9"), ip("198.51.100.1"));
        let first = shares.try_take(greedy).expect("a first share");
        let _second = shares.try_take(greedy).expect("a second share");
        assert!(
            shares.try_take(greedy).is_none(),
            "a third is over the share"
        );
        let waited = shares
            .take_within(greedy, std::time::Duration::from_millis(50))
            .await;
        assert!(waited.is_none(), "waiting does not get past the share");
        assert!(
            shares.try_take(other).is_some(),
            "another client is not held up"
        );
        drop(first);
        assert!(
            shares.try_take(greedy).is_some(),
            "an ended share frees its place"
        );
    }

    #[tokio::test]
    async fn a_wait_given_up_leaves_nothing_behind_and_one_network_is_one_client() {
        let shares = ClientShares::new(1);
        let held = shares.try_take(ip("2001:db8:1:2::1")).expect("a share");
        // Another address of the same /64 is the same client: it waits, and gives up.
        let waiting = shares.take_within(ip("2001:db8:1:2::9"), std::time::Duration::from_secs(60));
        let gave_up = tokio::time::timeout(std::time::Duration::from_millis(20), waiting).await;
        assert!(gave_up.is_err(), "still waiting when its request went away");
        drop(held);
        assert_eq!(
            shares.clients_in_flight(),
            0,
            "nothing kept for the one that gave up"
        );
        // An IPv4 peer as a dual-stack listener sees it is trusted as IPv4.
        let trusted = default_trusted_proxies();
        assert!(is_trusted(ip("::ffff:10.1.2.3"), &trusted));
        assert_eq!(counted_as(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
    }

    #[test]
    fn a_client_whose_shares_all_ended_is_forgotten() {
        let shares = ClientShares::new(1);
        for n in 0..100u8 {
            let share = shares.try_take(IpAddr::from([192, 0, 2, n]));
            assert!(share.is_some());
        }
        assert_eq!(
            shares.clients_in_flight(),
            0,
            "nothing kept per past client"
        );
        let held = shares.try_take(ip("192.0.2.1"));
        assert!(shares.try_take(ip("192.0.2.1")).is_none());
        assert_eq!(
            shares.clients_in_flight(),
            1,
            "a refused take keeps the holder's entry"
        );
        drop(held);
        assert_eq!(shares.clients_in_flight(), 0);
    }
}
