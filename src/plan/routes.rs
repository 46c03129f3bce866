//! Which of the environment's objects route its host: an Ingress with a rule for it, or a
//! Gateway API HTTPRoute or GRPCRoute that lists it (a `*.example.com` wildcard counts for one
//! label). The URL is reported only once one of them is healthy; a template that routes nothing
//! gets no URL in the status or the PR comment, rather than a link to nothing.

use super::render::RenderedObject;

/// An object that routes the environment's host, by kind and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub kind: String,
    pub name: String,
}

/// The objects among `objects` that route `host`.
pub fn routes_to(objects: &[RenderedObject], host: &str) -> Vec<Route> {
    objects
        .iter()
        .filter(|object| hosts_of(object).any(|pattern| host_matches(pattern, host)))
        .map(|object| Route {
            kind: object.kind().to_string(),
            name: object.name().to_string(),
        })
        .collect()
}

/// The hosts of `allowed` (the template's `policy.allowedIngressHosts`) that `objects` route,
/// lower-cased, sorted, once each: the environment claims them like its URL host.
pub fn extra_hosts(objects: &[RenderedObject], allowed: &[String]) -> Vec<String> {
    let mut claimed: Vec<String> = objects
        .iter()
        .flat_map(hosts_of)
        .filter(|host| allowed.iter().any(|a| a.eq_ignore_ascii_case(host)))
        .map(str::to_ascii_lowercase)
        .collect();
    claimed.sort();
    claimed.dedup();
    claimed
}

/// The host names an object routes: an Ingress's rules, a route's `hostnames`.
fn hosts_of(object: &RenderedObject) -> Box<dyn Iterator<Item = &str> + '_> {
    let group = object.api_version().split_once('/').map(|(group, _)| group);
    let spec = &object.object["spec"];
    let strings = |list: &'static str| -> Vec<&str> {
        spec[list]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(move |entry| match list {
                "rules" => entry["host"].as_str(),
                _ => entry.as_str(),
            })
            .collect()
    };
    match (group, object.kind()) {
        (Some("networking.k8s.io"), "Ingress") => Box::new(strings("rules").into_iter()),
        (Some("gateway.networking.k8s.io"), "HTTPRoute" | "GRPCRoute") => {
            Box::new(strings("hostnames").into_iter())
        }
        _ => Box::new(std::iter::empty()),
    }
}

/// Whether `pattern` (a host, or `*.` and a domain) covers `host`. Host names compare without
/// regard to case.
fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(domain) => host
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest.eq_ignore_ascii_case(domain)),
        None => pattern.eq_ignore_ascii_case(host),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn object(object: Value) -> RenderedObject {
        RenderedObject {
            manifest: "web.yaml".into(),
            wave: 0,
            seed: None,
            object,
        }
    }

    fn ingress(name: &str, hosts: &[&str]) -> RenderedObject {
        let rules: Vec<Value> = hosts.iter().map(|h| json!({"host": h})).collect();
        object(
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name}, "spec": {"rules": rules}}),
        )
    }

    #[test]
    fn ingresses_and_gateway_routes_for_the_host_route_it() {
        let host = "pr-2.preview.example.com";
        let objects = [
            ingress("other", &["docs.example.com"]),
            ingress("web", &["docs.example.com", "PR-2.preview.example.com"]),
            object(
                json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": "api"}, "spec": {"hostnames": ["*.preview.example.com"]}}),
            ),
            // Named like a route, in another group: not a route.
            object(json!({"apiVersion": "example.com/v1", "kind": "HTTPRoute",
                "metadata": {"name": "fake"}, "spec": {"hostnames": [host]}})),
            object(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}})),
        ];
        let names: Vec<String> = routes_to(&objects, host)
            .into_iter()
            .map(|r| format!("{}/{}", r.kind, r.name))
            .collect();
        assert_eq!(names, ["Ingress/web", "HTTPRoute/api"]);
    }

    #[test]
    fn a_wildcard_covers_exactly_one_label() {
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(!host_matches("*.example.com", "a.b.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(!host_matches("*.example.com", ".example.com"));
        assert!(!host_matches("a.example.com", "b.example.com"));
    }
}
