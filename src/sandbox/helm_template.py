"""`helm template` for the sandbox and the tests, on the real Helm engine: Helm's Go SDK as the
PyPI package helm-python-sdk carries it (see src/sandbox/helm_engine.rs, which installs it and
writes this script beside it). There is no `helm` binary to install from the registries this
project may use, so this script takes the place of the command line:
it reads the arguments previewd passes (src/engines/helm.rs) and prints what `helm template`
prints, one `---` / `# Source: <chart>/<path>` document per rendered file. The rendering itself
(Go templates, values merging, the values schema, `required`, subcharts) is Helm's.

usage: helm_template.py template RELEASE CHART --namespace NS --values FILE [--include-crds]
       helm_template.py pull NAME --repo URL --version VERSION --destination DIR
       helm_template.py pull oci://HOST/PATH/NAME --version VERSION --destination DIR
CHART is a folder or a chart archive (.tgz); `pull` downloads with Helm's own pull action, as
`helm pull` does (previewd pulls a published chart first, then renders the archive).
"""
import json
import sys

import helm_python as helm


def fail(message):
    print(f"Error: {message}", file=sys.stderr)
    sys.exit(1)


def options_of(rest, flags_with_value):
    options = {"--include-crds": False}
    while rest:
        flag = rest.pop(0)
        if flag == "--include-crds":
            options[flag] = True
        elif flag in flags_with_value and rest:
            options[flag] = rest.pop(0)
        else:
            fail(f"unsupported flag {flag}")
    return options


def pull(argv):
    if not argv:
        fail("pull: no chart named")
    chart = argv[0]
    options = options_of(argv[1:], ("--repo", "--version", "--destination"))
    try:
        helm.pull(chart, repo_url=options.get("--repo"), version=options.get("--version"),
                  destination=options.get("--destination"))
    except helm.HelmError as error:
        fail(str(error))


def template(argv):
    if len(argv) < 2:
        fail(f"unsupported command line: {argv}")
    release, chart_path = argv[0], argv[1]
    options = options_of(argv[2:], ("--namespace", "--values"))
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


def main(argv):
    if argv[:1] == ["pull"]:
        pull(argv[1:])
    elif argv[:1] == ["template"]:
        template(argv[1:])
    else:
        fail(f"unsupported command line: {argv}")


main(sys.argv[1:])
