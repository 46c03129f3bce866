"""Prints the manifest Helm's install action renders for a chart in a client-only dry run (the
code path `helm template` takes), without hooks, for the chart tests to compare previewd's
objects with.

usage: helm_install_manifest.py CHART RELEASE NAMESPACE VALUES_JSON
"""
import json
import sys

import helm_python as helm

chart, release, namespace, values = sys.argv[1:5]
config = helm.Config(namespace=namespace, storage_driver="memory")
release = config.install(chart, release, json.loads(values), namespace=namespace, dry_run="client")
sys.stdout.write(release["manifest"])
