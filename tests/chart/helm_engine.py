"""Lints and renders charts/previewd with the Helm engine (Helm's Go SDK, as carried by the PyPI
package helm-python-sdk), for tests/integration/chart.rs.

usage: helm_engine.py CHART RELEASE NAMESPACE VALUES_JSON
prints one JSON object:
  lint:    {"defaults": report, "everything_on": report}   (helm lint --strict reports)
  refused: {case: message}   values the schema must refuse, with Helm's message (null: accepted)
  rendered: {template path: manifest text}   for VALUES_JSON
  crds:    [file text]   the chart's crds/ (Helm installs them before the templates)
"""
import json
import sys

import helm_python as helm

chart_path, release, namespace, values_json = sys.argv[1:5]
values = json.loads(values_json)

everything_on = {
    "ingress": {"enabled": True, "className": "nginx", "tls": [{"secretName": "t", "hosts": ["previewd.example.com"]}]},
    "serviceMonitor": {"enabled": True},
    "traffic": {"prometheusUrl": "http://prometheus.monitoring:9090",
                "query": "sum(increase(nginx_ingress_controller_requests{host=\"{{ host }}\"}[10m]))"},
    "wakeGate": {"enabled": True, "ingress": {"enabled": True, "className": "nginx"},
                 "httpRoute": {"enabled": True, "parentRefs": [{"name": "previews", "namespace": "gateway-system"}]}},
    "watchNamespace": "apps",
    "rbac": {"bindableClusterRoles": ["view"], "secretNamespaces": ["apps", "team-b"]},
}
lint = {
    "defaults": helm.lint(chart_path, strict=True, namespace=namespace),
    "everything_on": helm.lint(chart_path, everything_on, strict=True, namespace=namespace),
}

bad_values = {
    "zero_replicas": {"replicaCount": 0},
    "unknown_key": {"replicas": 2},
    "bad_duration": {"controller": {"leaseDuration": "fifteen seconds"}},
    "bad_log_format": {"controller": {"logFormat": "xml"}},
    # Kinds are listed in templateKinds / extraTemplateKinds, each whole and spelled as the API does.
    "template_resources": {"rbac": {"templateResources": [{"apiGroup": "", "resources": ["nodes"]}]}},
    "template_kind_wildcard": {"extraTemplateKinds": [{"group": "", "kind": "Node", "resource": "*"}]},
    "template_kind_without_resource": {"extraTemplateKinds": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}]},
    "bad_secret_namespace": {"rbac": {"secretNamespaces": ["Kube System"]}},
    # The gate's route is the URL domain's wildcard: one exact host would take a neighbour's.
    "wake_gate_exact_host": {"wakeGate": {"ingress": {"host": "app.example.com"}}},
    "wake_gate_on_the_webhook_port": {"wakeGate": {"port": 8080}},
    "price_not_a_number": {"prices": {"perCoreHour": "cheap"}},
    # Less than one report's requests: no report could ever go out.
    "forge_content_below_one_report": {"forgeContent": {"perMinute": 4}},
    "traffic_query_without_the_host": {"traffic": {"prometheusUrl": "http://prometheus:9090", "query": "sum(requests)"}},
}
refused = {}
with helm.Chart.load(chart_path) as chart:
    for case, bad in bad_values.items():
        try:
            chart.validate_schema(bad)
            refused[case] = None
        except Exception as error:  # the SDK raises HelmValuesError with Helm's message
            refused[case] = str(error)
    rendered = chart.render(values, name=release, namespace=namespace, is_install=True)
    crds = [crd["data"] for crd in chart.crds]

json.dump({"lint": lint, "refused": refused, "rendered": rendered, "crds": crds}, sys.stdout)
