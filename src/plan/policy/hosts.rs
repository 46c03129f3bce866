//! Host names (pure): which names an Ingress, a Gateway API route or a certificate may claim.
//! Only the environment's URL host, or names the template lists: never every host, and not a
//! sibling in the same domain (another environment's URL host).
//!
//! Not names below the URL host either: the URL host's first label comes from the branch name,
//! which the pull request's author picks, so a branch named `boutique` of a template whose
//! hosts are `{{ slug }}.preview.example.com` has the URL host `boutique.preview.example.com`,
//! and every name below it (`main.boutique.preview.example.com`) may be another template's
//! environment. A template that wants more names for its environments lists fixed extra names.

use serde_json::Value;

use crate::model::crd::PolicySpec;

/// A Gateway API route's `hostnames` (never empty: that takes every host of the listener).
pub fn route_hostnames(object: &Value, policy: &PolicySpec, url_host: &str) -> Vec<String> {
    let hostnames = strings(&object["spec"]["hostnames"]);
    if hostnames.is_empty() {
        return vec![format!(
            "spec.hostnames is empty, so the route would take every host of its Gateway's listener: list the environment's host ({url_host:?})"
        )];
    }
    hosts_outside(hostnames.into_iter(), policy, url_host)
}

/// A cert-manager Certificate's `dnsNames` and `commonName`.
pub fn certificate_names(object: &Value, policy: &PolicySpec, url_host: &str) -> Vec<String> {
    let spec = &object["spec"];
    let names = strings(&spec["dnsNames"])
        .into_iter()
        .chain(spec["commonName"].as_str());
    hosts_outside(names, policy, url_host)
}

fn strings(list: &Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|entry| entry.as_str().unwrap_or_default())
        .collect()
}

/// A violation for each host that is not the environment's.
pub fn hosts_outside<'a>(
    hosts: impl Iterator<Item = &'a str>,
    policy: &PolicySpec,
    url_host: &str,
) -> Vec<String> {
    hosts
        .filter(|host| !host_allowed(host, url_host, &policy.allowed_ingress_hosts))
        .map(|host| format!(
            "host {host:?} is not the environment's URL host {url_host:?}: list it in the template's policy.allowedIngressHosts"
        ))
        .collect()
}

/// Whether a route may claim `host`: the URL host, or a host the template allows. An empty
/// host (every host) never; a wildcard only where the template lists it.
pub fn host_allowed(host: &str, url_host: &str, allowed: &[String]) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let url_host = url_host.trim_end_matches('.').to_ascii_lowercase();
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(&host)) && !host.is_empty() {
        return true;
    }
    if host.is_empty() || host.contains('*') || url_host.is_empty() {
        return false;
    }
    host == url_host
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_url_host_and_names_below_it() {
        let url_host = "pr-1.preview.example.com";
        for fine in ["pr-1.preview.example.com", "PR-1.preview.example.com."] {
            assert!(host_allowed(fine, url_host, &[]), "{fine}");
        }
        for hostile in [
            "pr-2.preview.example.com",
            // Below the URL host: a branch named like another template's domain label would
            // reach that template's environments.
            "api.pr-1.preview.example.com",
            "api-pr-1.preview.example.com",
            "x-pr-1.preview.example.com",
            "preview.example.com",
            "evilpr-1.preview.example.com",
            "*.pr-1.preview.example.com",
            "",
        ] {
            assert!(!host_allowed(hostile, url_host, &[]), "{hostile:?}");
        }
        let listed = ["demo.example.com".to_string()];
        assert!(host_allowed("demo.example.com", url_host, &listed));
        assert!(!host_allowed("", "", &[String::new()]), "never every host");
    }
}
