//! Every setting `previewd run` has, parsed once from flags and environment variables. Nothing
//! else in previewd reads the environment (the sandbox's own flags are in `sandbox::cli`; the
//! command line that joins both is `main.rs`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::forge::budget::ContentLimits;
use crate::model::durations::parse_duration;
use crate::model::grants::{
    AnnotationKeys, OperatorPolicy, RoleGrants, parse_annotation_keys, parse_annotation_patterns,
};
use crate::model::kinds::TemplateKinds;

#[derive(Clone, Copy, Debug, clap::ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// Only watch PreviewTemplates and PreviewEnvironments in this namespace (default: all).
    #[arg(long, env = "PREVIEWD_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Environments reconciled at once; the others wait their turn.
    #[arg(long, env = "PREVIEWD_RECONCILE_CONCURRENCY", default_value_t = crate::reconcile::config::DEFAULT_RECONCILE_CONCURRENCY)]
    pub reconcile_concurrency: u16,
    /// Server-side applies in flight at once within a wave.
    #[arg(long, env = "PREVIEWD_APPLY_CONCURRENCY", default_value_t = 16)]
    pub apply_concurrency: usize,
    /// How often every environment is reconciled with nothing having changed, e.g. `10m`. It
    /// compares with what the watches show and writes only if something drifted.
    #[arg(long, env = "PREVIEWD_RESYNC_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub resync_interval: Duration,
    /// Also re-apply every object of an environment this often, sent even when the watch shows
    /// no drift (e.g. `24h`). Unset by default: it costs writes for environments that did not
    /// change, and the watch-based comparison already repairs drift in every field previewd sets.
    #[arg(long, env = "PREVIEWD_REAPPLY_INTERVAL", value_parser = parse_duration)]
    pub reapply_interval: Option<Duration>,
    /// How often the sweep removes environments whose PR is closed, whose branch is gone,
    /// that are idle or too old, and orphaned namespaces (also once at start-up).
    #[arg(long, env = "PREVIEWD_SWEEP_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub sweep_interval: Duration,
    /// A template that renders more objects than this for one environment is refused, with
    /// the condition `TooManyObjects` on the environment.
    #[arg(long, env = "PREVIEWD_MAX_OBJECTS_PER_ENVIRONMENT", default_value_t = crate::reconcile::DEFAULT_MAX_OBJECTS)]
    pub max_objects_per_environment: usize,
    /// A template whose objects take more than this together (as JSON: `8Mi`, or bytes) is
    /// refused, with `TooManyObjects`: what the quota does not count stays bounded too.
    #[arg(long, env = "PREVIEWD_MAX_BYTES_PER_ENVIRONMENT", default_value = "8Mi", value_parser = parse_bytes)]
    pub max_bytes_per_environment: u64,
    /// How long a removed environment's namespace may terminate before previewd says what
    /// holds it (the namespace's own conditions: finalizers, content left), on the environment,
    /// in its PR comment and in `previewd_namespace_holds_total`.
    #[arg(long, env = "PREVIEWD_NAMESPACE_HOLD_GRACE", default_value = "5m", value_parser = parse_duration)]
    pub namespace_hold_grace: Duration,
    /// The kinds templates may create, as a JSON list of `{"group", "kind", "resource"}`
    /// (the chart builds it from its `templateKinds` and `extraTemplateKinds` values, and its
    /// RBAC from the same list). Default: the built-in list in docs/writing-templates.md. Only
    /// namespaced kinds; previewd's own, cluster-scoped ones and the guard rails are refused.
    #[arg(long, env = "PREVIEWD_TEMPLATE_KINDS", value_parser = TemplateKinds::parse)]
    pub template_kinds: Option<TemplateKinds>,
    /// What template Roles may grant, as a JSON list of `{"apiGroups", "resources", "verbs"}`
    /// (the chart's `templateRoleRules`, which also go into previewd's environment role, since
    /// the API server lets previewd create only Roles that grant what it holds). Default: the
    /// built-in list in docs/security.md (reads of the application's kinds, Leases, Events).
    #[arg(long, env = "PREVIEWD_TEMPLATE_ROLE_RULES", value_parser = RoleGrants::parse)]
    pub template_role_rules: Option<RoleGrants>,
    /// The Ingress annotations templates may set, as a JSON list of exact keys (the chart's
    /// `ingressAnnotations`; default none). Each configures the ingress controller every team
    /// shares: allow only what no pull request can turn against it (docs/security.md).
    #[arg(long, env = "PREVIEWD_INGRESS_ANNOTATIONS", value_parser = parse_annotation_keys)]
    pub ingress_annotations: Option<AnnotationKeys>,
    /// Annotations with a DNS-named prefix that other objects (Services, pod templates, …) may
    /// carry beyond the built-in inert ones, as a JSON list of exact keys or `prefix/*` (the
    /// chart's `objectAnnotations`; default none). Each configures a controller other teams
    /// share: a mesh, an API gateway, a secret injector, external-dns (docs/security.md).
    #[arg(long, env = "PREVIEWD_OBJECT_ANNOTATIONS", value_parser = parse_annotation_patterns)]
    pub object_annotations: Option<AnnotationKeys>,
    /// Labels with a DNS-named prefix that objects and pod templates may carry beyond
    /// `app.kubernetes.io/*` and `helm.sh/*`, as a JSON list of exact keys or `prefix/*` (the
    /// chart's `objectLabels`; default none). Each configures a controller other teams share:
    /// a mesh's injection or data plane, kube-proxy (docs/security.md).
    #[arg(long, env = "PREVIEWD_OBJECT_LABELS", value_parser = parse_annotation_patterns)]
    pub object_labels: Option<AnnotationKeys>,
    /// What a template's `policy` and `namespace` fields may ask for, as a JSON object field by
    /// field (the chart's `templateCeiling`; docs/security.md lists the fields). Default:
    /// nothing beyond Pod Security Baseline, no extra ClusterRole, Ingress host, namespace
    /// label or network reach. A template asking for more is refused, every field named.
    #[arg(long, env = "PREVIEWD_TEMPLATE_CEILING", value_parser = crate::model::ceiling::parse_ceiling)]
    pub template_ceiling: Option<crate::model::ceiling::TemplateCeiling>,
    /// Let claims ask for a storage class whose volumes outlive their claims
    /// (`reclaimPolicy: Retain`; the chart's `controller.allowRetainedVolumes`). Off by default:
    /// every environment removed would leave its volumes, and their disks, behind.
    #[arg(long, env = "PREVIEWD_ALLOW_RETAINED_VOLUMES", default_value_t = false, action = clap::ArgAction::Set)]
    pub allow_retained_volumes: bool,
    /// The longest `terminationGracePeriodSeconds` a template's pod may ask for: a sleeping or
    /// removed environment's pods stop within it.
    #[arg(long, env = "PREVIEWD_MAX_TERMINATION_GRACE_PERIOD", default_value = "5m", value_parser = parse_duration)]
    pub max_termination_grace_period: Duration,
    /// previewd's own ClusterRoles, comma-separated (the chart's two): no template may bind
    /// them, whatever the ceiling says. `--environment-role` is always one of them.
    #[arg(long, env = "PREVIEWD_OWN_CLUSTER_ROLES", value_delimiter = ',')]
    pub own_cluster_roles: Vec<String>,
    /// The `helm` program that renders templates' Helm charts (`helm template`); a bare name is
    /// looked up in previewd's PATH. The container image must carry it (docs/installing.md).
    #[arg(long, env = "PREVIEWD_HELM", default_value = "helm")]
    pub helm: PathBuf,
    /// The `kubectl` program that builds templates' Kustomize overlays (`kubectl kustomize`);
    /// a bare name is looked up in previewd's PATH (docs/installing.md).
    #[arg(long, env = "PREVIEWD_KUBECTL", default_value = "kubectl")]
    pub kubectl: PathBuf,
    /// How long one chart render or overlay build may take before it is stopped and the environment says so.
    #[arg(long, env = "PREVIEWD_RENDER_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub render_timeout: Duration,
    /// How much memory one `helm` or `kubectl kustomize` run may take (`384Mi`, `1Gi`, or
    /// bytes): the kernel refuses it more, and the environment says so. Keep two of them and
    /// previewd itself under the container's memory limit (they share it).
    #[arg(long, env = "PREVIEWD_RENDER_MEMORY_LIMIT", default_value = "384Mi", value_parser = parse_size)]
    pub render_memory_limit: u64,
    /// Whether `helm` and `kubectl kustomize` run only behind the kernel's walls (Landlock: their
    /// private folder and the system's programs only; seccomp: no socket). `required` (the
    /// default) renders nothing on a node that lacks either, and says so on the environment;
    /// `best-effort` runs them behind whatever the kernel has (docs/security.md).
    #[arg(
        long,
        env = "PREVIEWD_ENGINE_CONTAINMENT",
        value_enum,
        default_value = "required"
    )]
    pub engine_containment: crate::engines::contain::ContainmentMode,
    /// The ClusterRole previewd binds to its own ServiceAccount in each environment namespace
    /// it creates (the chart's `<release>-environment`). Set it when previewd's RBAC lets it
    /// write only there; it needs `--service-account` too.
    #[arg(long, env = "PREVIEWD_ENVIRONMENT_ROLE", requires = "service_account")]
    pub environment_role: Option<String>,
    /// previewd's own ServiceAccount, as `namespace/name`: the subject of the environment role's
    /// bindings.
    #[arg(long, env = "PREVIEWD_SERVICE_ACCOUNT", value_parser = parse_service_account, requires = "environment_role")]
    pub service_account: Option<(String, String)>,
    /// What one core requested for an hour costs, e.g. `0.04`: the PR comment and the metrics
    /// show each environment's cost and what sleeping saved. Unset: resource-hours only.
    #[arg(long, env = "PREVIEWD_PRICE_PER_CORE_HOUR", value_parser = parse_price, requires = "price_per_gib_hour")]
    pub price_per_core_hour: Option<f64>,
    /// What one GiB of memory requested for an hour costs, e.g. `0.005`.
    #[arg(long, env = "PREVIEWD_PRICE_PER_GIB_HOUR", value_parser = parse_price, requires = "price_per_core_hour")]
    pub price_per_gib_hour: Option<f64>,
    /// Written before amounts, e.g. `$`, `€` or `EUR `.
    #[arg(long, env = "PREVIEWD_CURRENCY", default_value = "$")]
    pub currency: String,
    /// Content-creating forge requests (comments, commit statuses, deployments) previewd sends
    /// per GitHub App installation or token (GitHub or GitLab) in any minute. GitHub
    /// allows 80; the default leaves room for other tools on the same token (docs/forges.md).
    #[arg(long, env = "PREVIEWD_FORGE_CONTENT_PER_MINUTE", default_value_t = ContentLimits::default().per_minute, value_parser = parse_content_limit)]
    pub forge_content_per_minute: u32,
    /// The same, in any hour. GitHub allows 500.
    #[arg(long, env = "PREVIEWD_FORGE_CONTENT_PER_HOUR", default_value_t = ContentLimits::default().per_hour, value_parser = parse_content_limit)]
    pub forge_content_per_hour: u32,
    /// previewd's own namespace, where the kubeconfig Secrets of registered clusters
    /// (`PreviewCluster`) are. Unset: placement on registered clusters is off.
    #[arg(long, env = "PREVIEWD_CLUSTER_CREDENTIALS_NAMESPACE")]
    pub cluster_credentials_namespace: Option<String>,
    /// previewd's own namespace, where the admin Secrets of registered database servers
    /// (`PreviewDatabaseServer`) are. Unset: databases per environment are off.
    #[arg(long, env = "PREVIEWD_DATABASE_CREDENTIALS_NAMESPACE")]
    pub database_credentials_namespace: Option<String>,
    /// How often each registered cluster is looked at.
    #[arg(long, env = "PREVIEWD_CLUSTER_LOOK_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub cluster_look_interval: std::time::Duration,
    /// How long a registered cluster may fail to answer before it is said unreachable (no
    /// new environments; its own are kept).
    #[arg(long, env = "PREVIEWD_CLUSTER_UNREACHABLE_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub cluster_unreachable_grace: std::time::Duration,
}

impl ControllerArgs {
    /// `--own-cluster-roles` with `--environment-role`.
    fn own_cluster_roles(&self) -> Vec<String> {
        let mut roles = self.own_cluster_roles.clone();
        roles.extend(self.environment_role.clone());
        roles
    }
}

/// A content budget: at least what one report sends, or no report could ever go out.
fn parse_content_limit(text: &str) -> Result<u32, String> {
    let least = crate::forge::budget::MOST_REQUESTS_PER_REPORT;
    match text.parse::<u32>() {
        Ok(limit) if limit >= least => Ok(limit),
        _ => Err(format!(
            "{text:?}: write a whole number of requests, at least {least} (one report's)"
        )),
    }
}

/// A price: a finite number, zero or more.
fn parse_price(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(price) if price.is_finite() && price >= 0.0 => Ok(price),
        _ => Err(format!(
            "{text:?} is not a price (a number, 0 or more, e.g. 0.04)"
        )),
    }
}

/// An engine's memory limit ([`parse_bytes`]): at least 16 MiB (less than any engine needs to
/// start).
fn parse_size(text: &str) -> Result<u64, String> {
    let bytes = parse_bytes(text)?;
    if bytes < 16 << 20 {
        return Err(format!(
            "{text:?} is less than 16Mi, too little for any engine to start"
        ));
    }
    Ok(bytes)
}

/// A size as Kubernetes writes memory: bytes, or a number with `Ki`, `Mi` or `Gi`.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => {
            return Err(format!(
                "{text:?}: write bytes, or a number with Ki, Mi or Gi"
            ));
        }
    };
    let bytes = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{text:?} is not a size previewd can hold"))?;
    Ok(bytes)
}

/// `namespace/name`, both non-empty.
fn parse_service_account(text: &str) -> Result<(String, String), String> {
    match text.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok((namespace.to_string(), name.to_string()))
        }
        _ => Err(format!(
            "expected the ServiceAccount as namespace/name, got {text:?}"
        )),
    }
}

impl ControllerArgs {
    pub fn controller_config(&self) -> crate::reconcile::ControllerConfig {
        let environment_access = match (&self.environment_role, &self.service_account) {
            (Some(role), Some((namespace, name))) => Some(crate::reconcile::EnvironmentAccess {
                cluster_role: role.clone(),
                service_account_namespace: namespace.clone(),
                service_account_name: name.clone(),
            }),
            _ => None,
        };
        crate::reconcile::ControllerConfig {
            environment_access,
            namespace: self.watch_namespace.clone(),
            reconcile_concurrency: self.reconcile_concurrency.max(1),
            apply_concurrency: self.apply_concurrency.max(1),
            resync_interval: self.resync_interval,
            reapply_interval: self.reapply_interval,
            max_objects: self.max_objects_per_environment.max(1),
            max_bytes: usize::try_from(self.max_bytes_per_environment).unwrap_or(usize::MAX),
            namespace_hold_grace: self.namespace_hold_grace,
            template_kinds: self.template_kinds.clone().unwrap_or_default(),
            operator_policy: OperatorPolicy {
                role_grants: self.template_role_rules.clone().unwrap_or_default(),
                ingress_annotations: self.ingress_annotations.clone().unwrap_or_default().0,
                object_annotations: self.object_annotations.clone().unwrap_or_default().0,
                object_labels: self.object_labels.clone().unwrap_or_default().0,
                ceiling: self.template_ceiling.clone().unwrap_or_default(),
                own_cluster_roles: self.own_cluster_roles(),
                max_grace_period: Some(self.max_termination_grace_period.as_secs()),
                allow_retained_volumes: self.allow_retained_volumes,
            },
            engines: crate::engines::EngineConfig {
                helm: self.helm.clone(),
                kubectl: self.kubectl.clone(),
                timeout: self.render_timeout,
                memory_limit: self.render_memory_limit,
                worker: crate::engines::worker::this_program(),
                containment: self.engine_containment,
            },
            forge_api_defaults: Default::default(),
            gate_answers: false,
            prices: self.prices(),
            content_limits: ContentLimits {
                per_minute: self.forge_content_per_minute,
                per_hour: self.forge_content_per_hour,
            },
            placement: crate::reconcile::remote::PlacementConfig {
                credentials_namespace: self.cluster_credentials_namespace.clone(),
                look_interval: self.cluster_look_interval,
                unreachable_grace: self.cluster_unreachable_grace,
            },
            databases: crate::reconcile::databases::DatabaseConfig {
                credentials_namespace: self.database_credentials_namespace.clone(),
            },
        }
    }

    /// The prices, when both are given.
    pub fn prices(&self) -> Option<crate::model::footprint::Prices> {
        match (self.price_per_core_hour, self.price_per_gib_hour) {
            (Some(per_core_hour), Some(per_gib_hour)) => Some(crate::model::footprint::Prices {
                per_core_hour,
                per_gib_hour,
                currency: self.currency.chars().take(8).collect(),
            }),
            _ => None,
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Path of a kubeconfig to use instead of the in-cluster or default configuration.
    #[arg(long, env = "PREVIEWD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Requests to the Kubernetes API in flight at once; the rest wait their turn. Each one in
    /// flight holds a connection (HTTP/1.1), so this also bounds previewd's connections (and
    /// its memory) however many environments reconcile at once. The Lease has its own.
    #[arg(long, env = "PREVIEWD_API_CONCURRENCY", default_value_t = crate::cluster::client::DEFAULT_API_CONCURRENCY)]
    pub api_concurrency: usize,
    /// Address of the HTTP server (webhooks, /metrics, /healthz, /readyz).
    #[arg(long, env = "PREVIEWD_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: std::net::SocketAddr,
    /// Address of the wake gate, e.g. `0.0.0.0:8081`: it answers for the hosts of sleeping
    /// environments with a waiting page and wakes them (docs/lifecycle.md). Route the URL
    /// domain's wildcard to it. Unset (the default): no gate, and a sleeping environment keeps
    /// its routes; only a push or `/preview wake` wakes it.
    #[arg(long, env = "PREVIEWD_GATE_LISTEN")]
    pub gate_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub gate: GateArgs,
    #[command(flatten)]
    pub traffic: TrafficArgs,
    #[command(flatten)]
    pub controller: ControllerArgs,
    #[command(flatten)]
    pub webhooks: WebhookArgs,
    #[command(flatten)]
    pub leader: LeaderArgs,
    /// On SIGTERM, how long in-flight webhook requests get to finish.
    #[arg(long, env = "PREVIEWD_SHUTDOWN_GRACE", default_value = "20s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
}

/// Leader election: every replica serves webhooks, only the Lease holder reconciles and sweeps.
#[derive(Debug, Args)]
pub struct LeaderArgs {
    /// Elect a leader through a Lease before reconciling. Turn off only when exactly one
    /// replica runs (two unelected replicas would both reconcile and sweep).
    #[arg(long, env = "PREVIEWD_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the Lease (default: the namespace previewd runs in, from the in-cluster
    /// service account or the kubeconfig context).
    #[arg(long, env = "PREVIEWD_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    #[arg(long, env = "PREVIEWD_LEASE_NAME", default_value = "previewd-leader")]
    pub lease_name: String,
    /// How long a Lease nobody renews keeps the other replicas waiting: the longest a
    /// crashed leader's work is left undone. The leader renews every seventh of it.
    #[arg(long, env = "PREVIEWD_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// This replica's name in the Lease (default: host name, i.e. the pod name, and a random
    /// suffix).
    #[arg(long, env = "PREVIEWD_IDENTITY")]
    pub identity: Option<String>,
}

impl LeaderArgs {
    /// The Lease settings, or `None` when leader election is off.
    pub fn settings(
        &self,
        default_namespace: &str,
    ) -> Option<crate::runtime::leader::LeaseSettings> {
        self.leader_elect.then(|| {
            crate::runtime::leader::LeaseSettings::with_duration(
                self.lease_namespace
                    .clone()
                    .unwrap_or_else(|| default_namespace.to_string()),
                self.lease_name.clone(),
                self.identity
                    .clone()
                    .unwrap_or_else(crate::runtime::leader::default_identity),
                self.lease_duration.max(Duration::from_secs(2)),
            )
        })
    }
}

/// Traffic as activity: requests to an environment's host, read from Prometheus, keep it awake
/// (docs/lifecycle.md). Unset: only pushes, commands and the wake gate count.
#[derive(Debug, Args)]
pub struct TrafficArgs {
    /// Prometheus' base URL, e.g. `http://prometheus.monitoring:9090`.
    #[arg(
        long,
        env = "PREVIEWD_TRAFFIC_PROMETHEUS_URL",
        requires = "traffic_query"
    )]
    pub traffic_prometheus_url: Option<url::Url>,
    /// PromQL that says how many requests a host got, with `{{ host }}` where the
    /// environment's host goes, e.g.
    /// `sum(increase(nginx_ingress_controller_requests{host="{{ host }}"}[10m]))`.
    #[arg(
        long,
        env = "PREVIEWD_TRAFFIC_QUERY",
        requires = "traffic_prometheus_url"
    )]
    pub traffic_query: Option<String>,
    /// How often each awake environment's traffic is asked about (and at most how often its
    /// activity is written); the query's range should cover it.
    #[arg(long, env = "PREVIEWD_TRAFFIC_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub traffic_interval: Duration,
}

impl TrafficArgs {
    /// The traffic source, if one is configured; a query without `{{ host }}` is an error.
    pub fn source(&self) -> Result<Option<crate::lifecycle::traffic::TrafficSource>, String> {
        let (Some(url), Some(query)) = (&self.traffic_prometheus_url, &self.traffic_query) else {
            return Ok(None);
        };
        let interval = self.traffic_interval.max(Duration::from_secs(10));
        crate::lifecycle::traffic::TrafficSource::new(url.clone(), query.clone(), interval)
            .map(Some)
    }
}

#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// Deliveries with a larger body are refused with 413. GitHub's pull_request deliveries
    /// are typically 20-40 KB; 2 MiB leaves room for pushes with many commits.
    #[arg(long, env = "PREVIEWD_WEBHOOK_MAX_BODY_BYTES", default_value_t = 2 * 1024 * 1024)]
    pub webhook_max_body_bytes: usize,
    /// Deliveries one client address may have handled at once, of the 64 all clients share;
    /// more wait for a turn (up to 10 s, then 503). The client is the peer, or the address a
    /// trusted proxy says the delivery came from (`--webhook-trusted-proxies`).
    #[arg(long, env = "PREVIEWD_WEBHOOK_DELIVERIES_PER_CLIENT", default_value_t = crate::webhook::server::DEFAULT_DELIVERIES_PER_CLIENT, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub webhook_deliveries_per_client: usize,
    /// Proxies whose `X-Forwarded-For` says who a delivery's client is (the ingress controller
    /// or gateway in front of the webhook endpoint), as a JSON list of networks or addresses.
    /// Default: the private, shared and loopback ranges, where a cluster's pods and nodes are.
    #[arg(long, env = "PREVIEWD_WEBHOOK_TRUSTED_PROXIES", value_parser = crate::model::clients::parse_trusted_proxies)]
    pub webhook_trusted_proxies: Option<Vec<ipnet::IpNet>>,
}

impl WebhookArgs {
    pub fn limits(&self) -> crate::webhook::server::DeliveryLimits {
        crate::webhook::server::DeliveryLimits {
            max_body_bytes: self.webhook_max_body_bytes,
            per_client: self.webhook_deliveries_per_client,
            trusted_proxies: self
                .webhook_trusted_proxies
                .clone()
                .unwrap_or_else(crate::model::clients::default_trusted_proxies),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{RunArgs, parse_bytes, parse_size};
    use clap::{FromArgMatches, Parser};

    #[derive(Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }

    /// Every flag's default parses (a default its own parser refuses stops `previewd run`).
    #[test]
    fn previewd_run_starts_with_every_default() {
        let matches = <Run as clap::CommandFactory>::command().try_get_matches_from(["previewd"]);
        let parsed = matches.and_then(|m| Run::from_arg_matches(&m));
        let run = parsed.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(run.args.controller.max_bytes_per_environment, 8 << 20);
        assert_eq!(parse_bytes("64Ki"), Ok(64 << 10));
    }

    #[test]
    fn sizes_are_read_as_kubernetes_writes_memory() {
        assert_eq!(parse_size("384Mi"), Ok(384 << 20));
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        assert_eq!(parse_size("20000000"), Ok(20_000_000));
        for bad in [
            "",
            "Mi",
            "1G",
            "12Mi",
            "-1Gi",
            "99999999999999999999Gi",
            "17179869184Gi",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}

/// Who may wake how much through the wake gate (docs/lifecycle.md, "Waking on the first
/// request"; docs/security.md).
#[derive(Debug, Clone, clap::Args)]
pub struct GateArgs {
    /// Wakes one client address (an IPv6 client: its /64) may cause per `--gate-wake-window`;
    /// a request beyond them gets the waiting page and wakes nothing.
    #[arg(long, env = "PREVIEWD_GATE_WAKES_PER_CLIENT", default_value_t = 10)]
    pub gate_wakes_per_client: u32,
    /// Wakes all clients together may cause per `--gate-wake-window` (in each replica).
    #[arg(long, env = "PREVIEWD_GATE_WAKES_IN_ALL", default_value_t = 60)]
    pub gate_wakes_in_all: u32,
    /// The sliding window of the wake budget.
    #[arg(long, env = "PREVIEWD_GATE_WAKE_WINDOW", default_value = "10m", value_parser = parse_duration)]
    pub gate_wake_window: Duration,
    /// The proxies whose `X-Forwarded-For` says who the client is (the ingress controller or
    /// gateway in front of the gate), as a JSON list of networks or addresses. Default: the
    /// private, shared and loopback ranges, where a cluster's pods and nodes are.
    #[arg(long, env = "PREVIEWD_GATE_TRUSTED_PROXIES", value_parser = crate::model::clients::parse_trusted_proxies)]
    pub gate_trusted_proxies: Option<Vec<ipnet::IpNet>>,
}

impl GateArgs {
    pub fn clients(&self) -> crate::gate::server::Clients {
        crate::gate::server::Clients {
            wakes: crate::gate::budget::WakeLimits {
                per_client: self.gate_wakes_per_client,
                in_all: self.gate_wakes_in_all,
                window: self.gate_wake_window,
            },
            trusted_proxies: self
                .gate_trusted_proxies
                .clone()
                .unwrap_or_else(crate::model::clients::default_trusted_proxies),
        }
    }
}
