"""`helm template` for the tests, on the real Helm engine: Helm's Go SDK as the PyPI package
helm-python-sdk carries it (see tests/support/helm.rs). There is no `helm` binary to install
from the registries this project may use, so this script takes the place of the command line:
it reads the arguments previewd passes (src/engines/helm.rs) and prints what `helm template`
prints, one `---` / `# Source: <chart>/<path>` document per rendered file. The rendering itself
(Go templates, values merging, the values schema, `required`, subcharts) is Helm's.

usage: helm_template.py template RELEASE CHART_DIR --namespace NS --values FILE [--include-crds]
Only charts in a folder: a published chart (--repo, oci://) is refused, as the tests have no
chart repository to reach.
"""
import json
import sys

import helm_python as helm


def fail(message):
    print(f"Error: {message}", file=sys.stderr)
    sys.exit(1)


def arguments(argv):
    if len(argv) < 3 or argv[0] != "template":
        fail(f"unsupported command line: {argv}")
    release, chart = argv[1], argv[2]
    options = {"--include-crds": False}
    rest = argv[3:]
    while rest:
        flag = rest.pop(0)
        if flag == "--include-crds":
            options[flag] = True
        elif flag in ("--namespace", "--values") and rest:
            options[flag] = rest.pop(0)
        else:
            fail(f"unsupported flag {flag} (the test engine renders charts in a folder only)")
    return release, chart, options


def main():
    release, chart_path, options = arguments(sys.argv[1:])
    values = {}
    if "--values" in options:
        with open(options["--values"]) as f:
            values = json.load(f)
    try:
        with helm.Chart.load(chart_path) as chart:
            rendered = chart.render(values, name=release, namespace=options.get("--namespace", "default"), is_install=True)
            crds = chart.crds if options["--include-crds"] else []
            name = chart.name
    except helm.HelmError as error:
        fail(str(error))
    out = []
    for crd in crds:
        out.append(f"---\n# Source: {name}/{crd['name']}\n{crd['data'].strip()}\n")
    for path in sorted(rendered):
        text = rendered[path].strip()
        if path.endswith("NOTES.txt") or not text:
            continue
        out.append(f"---\n# Source: {path}\n{text}\n")
    sys.stdout.write("".join(out))


main()
