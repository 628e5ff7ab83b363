#!/usr/bin/env python3
"""Checks custom resources against the CRDs' schemas, offline.

kubernetes-validate knows the built-in kinds (CustomResourceDefinition
included) but not the objects of custom kinds. This checks those:

* each CRD under deploy/base/crds is structural (every node has a type,
  no `properties` beside `additionalProperties`, a status subresource);
* every pxe-agent.io object in deploy/examples and in the built manifests
  given on the command line validates against its CRD's openAPIV3Schema,
  and has no field the schema does not declare (the API server would prune
  it silently; `kubectl apply --validate=strict` refuses it, and so do we);
* every object in bad-objects.yaml is rejected, for the reason its
  annotation `test.pxe-agent.io/expect` names (`PATH KEYWORD`);
* the DaemonSet of each built manifest agrees with itself: the flags'
  directories are its mounts, the probes, scrape annotation and PodMonitor
  use the admin port of --metrics-addr, the capabilities are the five the
  agent needs and no more, no preStop hook detaches XDP, and each entry of
  the interfaces ConfigMap is NAME[=IPv4] lines;
* the PodMonitor and SecurityContextConstraints of the built manifests
  validate against schemas/podmonitor.json and schemas/scc.json, written
  from the upstream CRDs' fields (kubernetes-validate has neither), and the
  SCC allows exactly the capabilities the DaemonSet adds.

Usage: check_crds.py DEPLOY_DIR [BUILT_MANIFEST.yaml ...]
Prints one line per check and exits 1 on any failure.
"""

import copy
import json
import re
import sys
from pathlib import Path

import jsonschema
import yaml

EXPECT = "test.pxe-agent.io/expect"
OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = rf"({OCTET}\.){{3}}{OCTET}"
GROUP = "pxe-agent.io"


def load_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def structural_problems(schema, path="openAPIV3Schema"):
    """Structural-schema rules the API server enforces on a CRD."""
    out = []
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
    int_or_string = schema.get("x-kubernetes-int-or-string") is True
    if "type" not in schema and not (preserve or int_or_string):
        out.append(f"{path}: no type")
    if "properties" in schema and "additionalProperties" in schema:
        out.append(f"{path}: properties and additionalProperties together")
    for name, sub in schema.get("properties", {}).items():
        out += structural_problems(sub, f"{path}.properties.{name}")
    if isinstance(schema.get("additionalProperties"), dict):
        out += structural_problems(schema["additionalProperties"], f"{path}.additionalProperties")
    if isinstance(schema.get("items"), dict):
        out += structural_problems(schema["items"], f"{path}.items")
    return out


def to_json_schema(schema):
    """The openAPIV3Schema as plain JSON Schema: x-kubernetes-* dropped
    (preserve-unknown-fields only means "anything" here), `nullable`
    turned into a null type."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if not isinstance(node, dict):
            return
        for key in [k for k in node if k.startswith("x-kubernetes-")]:
            del node[key]
        if node.pop("nullable", False) and "type" in node:
            node["type"] = [node["type"], "null"]
        for sub in node.get("properties", {}).values():
            walk(sub)
        for key in ("additionalProperties", "items"):
            walk(node.get(key))

    walk(schema)
    return schema


def unknown_fields(obj, schema, path=""):
    """Fields of `obj` that `schema` does not declare: what the API server
    prunes and `kubectl apply --validate=strict` refuses."""
    out = []
    if schema.get("x-kubernetes-preserve-unknown-fields") is True:
        return out
    if isinstance(obj, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            sub_path = f"{path}.{key}" if path else key
            if path == "" and key == "metadata":
                continue  # ObjectMeta: checked by the API server itself
            if props is not None and key in props:
                out += unknown_fields(value, props[key], sub_path)
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, sub_path)
            elif extra is True:
                pass
            else:
                out.append((sub_path, "unknown", f"unknown field {sub_path!r}"))
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out


def json_path(parts):
    """`spec.subnets[0].cidr`, as kubectl names a field."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def errors_of(obj, raw_schema, json_schema, prune=True):
    """(path, keyword, message) of every problem with `obj`; with `prune`,
    fields a structural schema would prune count as problems too."""
    validator = jsonschema.Draft7Validator(json_schema)
    out = []
    for e in validator.iter_errors(obj):
        path = json_path(e.absolute_path)
        if e.validator == "required":
            # Name the missing field in the path, as kubectl does.
            missing = e.message.split("'")[1]
            path = f"{path}.{missing}" if path else missing
        out.append((path, e.validator, e.message))
    if prune:
        out += unknown_fields(obj, raw_schema)
    return out


class Checker:
    def __init__(self):
        self.failures = 0
        self.passes = 0

    def ok(self, what):
        self.passes += 1
        print(f"ok    {what}")

    def fail(self, what, details=()):
        self.failures += 1
        print(f"FAIL  {what}")
        for line in details:
            print(f"        {line}")


def load_crds(crd_dir, check):
    crds = {}
    for path in sorted(Path(crd_dir).glob("*.yaml")):
        for crd in load_docs(path):
            spec = crd["spec"]
            for version in spec["versions"]:
                raw = version["schema"]["openAPIV3Schema"]
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                problems = structural_problems(raw)
                if "status" not in version.get("subresources", {}):
                    problems.append("no status subresource")
                if problems:
                    check.fail(f"{path.name} {key[1]} is structural", problems)
                else:
                    check.ok(f"{path.name} {key[1]} is structural")
                crds[key] = (raw, to_json_schema(raw))
    return crds


def name_of(obj):
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('name')}"


def check_good(obj, origin, crds, check):
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in crds:
        check.fail(f"{origin}: {name_of(obj)}: no CRD for {key[0]} {key[1]}")
        return
    errs = errors_of(obj, *crds[key])
    if errs:
        check.fail(f"{origin}: {name_of(obj)} is valid", [f"{p}: {m}" for p, _, m in errs])
    else:
        check.ok(f"{origin}: {name_of(obj)} is valid")


def check_bad(obj, origin, crds, check):
    expect = ((obj.get("metadata") or {}).get("annotations") or {}).get(EXPECT)
    what = f"{origin}: {name_of(obj)} is rejected"
    if not expect or len(expect.split()) != 2:
        check.fail(what, [f"annotation {EXPECT}: 'PATH KEYWORD' is missing"])
        return
    want_path, want_keyword = expect.split()
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in crds:
        check.fail(what, [f"no CRD for {key[0]} {key[1]}"])
        return
    errs = errors_of(obj, *crds[key])
    if any(p == want_path and k == want_keyword for p, k, _ in errs):
        reasons = "; ".join(m for p, k, m in errs if p == want_path and k == want_keyword)
        check.ok(f"{what} ({want_path}: {reasons})")
    else:
        got = [f"{p}: [{k}] {m}" for p, k, m in errs] or ["accepted"]
        check.fail(f"{what} for {want_path} {want_keyword}", got)


def added_capabilities(docs):
    caps = set()
    for d in docs:
        if d.get("kind") == "DaemonSet":
            for c in d["spec"]["template"]["spec"]["containers"]:
                caps |= set(c.get("securityContext", {}).get("capabilities", {}).get("add", []))
    return caps


def check_foreign(docs, origin, schemas, check):
    """PodMonitor and SCC: the kinds kubernetes-validate has no schema for."""
    for obj in docs:
        kind = obj.get("kind")
        if kind not in schemas:
            continue
        schema = schemas[kind]
        errs = [(p, m) for p, _, m in errors_of(obj, schema, schema, prune=False)]
        if kind == "SecurityContextConstraints":
            if "namespace" in (obj.get("metadata") or {}):
                errs.append(("metadata.namespace", "an SCC is cluster-scoped"))
            allowed = set(obj.get("allowedCapabilities") or [])
            added = added_capabilities(docs)
            if allowed != added:
                errs.append(("allowedCapabilities",
                             f"{sorted(allowed)} is not what the DaemonSet adds: {sorted(added)}"))
        if errs:
            check.fail(f"{origin}: {name_of(obj)} is valid", [f"{p}: {m}" for p, m in errs])
        else:
            check.ok(f"{origin}: {name_of(obj)} is valid")


AGENT_CAPABILITIES = {"BPF", "NET_ADMIN", "PERFMON", "NET_RAW", "NET_BIND_SERVICE"}
IFNAME = r"[^\s/=]{1,15}"
INTERFACE_LINE = re.compile(rf"^{IFNAME}(={IPV4})?$")


def daemonset_problems(docs):
    """What would make the DaemonSet fail on a node although every field
    is valid: its flags, mounts, ports and capabilities disagreeing."""
    out = []
    sets = [d for d in docs if d.get("kind") == "DaemonSet"]
    if len(sets) != 1:
        return [f"expected one DaemonSet, found {len(sets)}"]
    pod = sets[0]["spec"]["template"]
    spec = pod["spec"]
    if spec.get("hostNetwork") is not True:
        out.append("hostNetwork is not true")
    if spec.get("dnsPolicy") != "ClusterFirstWithHostNet":
        out.append("dnsPolicy is not ClusterFirstWithHostNet")
    (container,) = spec["containers"]
    flags = {}
    for arg in container.get("args", []):
        if arg.startswith("--"):
            name, _, value = arg[2:].partition("=")
            flags[name] = value
    for required in ("kube", "interface-dir", "pin-dir", "state-dir", "metrics-addr", "boot-root"):
        if required not in flags:
            out.append(f"--{required} is missing")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {m["mountPath"]: volumes.get(m["name"], {}) for m in container.get("volumeMounts", [])}

    def mounted(flag, source):
        path = flags.get(flag, "")
        hits = [v for mp, v in mounts.items() if path == mp or path.startswith(mp.rstrip("/") + "/")]
        if not any(source in v for v in hits):
            out.append(f"--{flag}={path} is not on a {source} volume mount")
        return hits

    for hit in mounted("pin-dir", "hostPath"):
        if hit.get("hostPath", {}).get("path") != "/sys/fs/bpf":
            out.append("--pin-dir is not on the node's /sys/fs/bpf")
    mounted("state-dir", "hostPath")
    tls = [flag for flag in ("api-tls-cert", "api-tls-key") if flag in flags]
    if len(tls) == 1:
        out.append(f"--{tls[0]} is given without its pair")
    for flag in tls:
        mounted(flag, "secret")
    interface_volumes = mounted("interface-dir", "configMap")
    port = flags.get("metrics-addr", ":").rpartition(":")[2]
    for probe in ("livenessProbe", "readinessProbe"):
        get = container.get(probe, {}).get("httpGet", {})
        if get.get("path") != "/healthz" or str(get.get("port")) != port:
            out.append(f"{probe} is not GET /healthz on port {port}")
    annotations = pod["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/port") != port or annotations.get("prometheus.io/scrape") != "true":
        out.append(f"prometheus.io annotations do not scrape port {port}")
    named = {p.get("name"): str(p["containerPort"]) for p in container.get("ports", [])}
    for monitor in (d for d in docs if d.get("kind") == "PodMonitor"):
        for endpoint in monitor["spec"].get("podMetricsEndpoints", []):
            if named.get(endpoint.get("port")) != port:
                out.append(f"PodMonitor scrapes port {endpoint.get('port')!r}, not {port}")
    security = container.get("securityContext", {})
    caps = security.get("capabilities", {})
    if caps.get("drop") != ["ALL"]:
        out.append("capabilities do not drop ALL")
    if set(caps.get("add", [])) != AGENT_CAPABILITIES:
        out.append(f"capabilities add {sorted(caps.get('add', []))}, not {sorted(AGENT_CAPABILITIES)}")
    if security.get("privileged") or security.get("allowPrivilegeEscalation") is not False:
        out.append("the container may be privileged or escalate")
    pre_stop = container.get("lifecycle", {}).get("preStop", {})
    if "detach" in json.dumps(pre_stop):
        out.append("a preStop hook detaches XDP: a rolling update would stop the fast path")
    for volume in interface_volumes:
        name = volume.get("configMap", {}).get("name")
        maps = [d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == name]
        if not maps:
            out.append(f"ConfigMap {name} of --interface-dir is not in the manifests")
        for cm in maps:
            data = cm.get("data", {})
            if "default" not in data:
                out.append(f"ConfigMap {name} has no `default` entry for unlisted nodes")
            for node, text in data.items():
                lines = [ln.split("#")[0].strip() for ln in text.splitlines()]
                bad = [ln for ln in lines if ln and not INTERFACE_LINE.match(ln)]
                if bad or not any(lines):
                    out.append(f"ConfigMap {name} entry {node!r}: not NAME[=IPv4] lines: {bad or text!r}")
    return out


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    deploy = Path(argv[1])
    here = Path(__file__).resolve().parent
    check = Checker()
    crds = load_crds(deploy / "base" / "crds", check)

    examples = sorted((deploy / "examples").glob("*.yaml"))
    seen_kinds = set()
    for path in examples:
        if path.name == "kustomization.yaml":
            continue
        for obj in load_docs(path):
            seen_kinds.add(obj.get("kind"))
            check_good(obj, f"examples/{path.name}", crds, check)
    for _, kind in crds:
        if kind not in seen_kinds:
            check.fail(f"examples: no example of {kind}")

    # The integration tests' objects (tests/src/kube.rs) are custom
    # resources too: what the fake API server serves must be what a real
    # one would accept.
    fixtures = sorted((deploy.parent / "tests" / "fixtures" / "kube").glob("*.yaml"))
    if not fixtures:
        check.fail("tests/fixtures/kube: no fixtures found")
    for path in fixtures:
        for obj in load_docs(path):
            if obj.get("apiVersion", "").startswith(GROUP + "/"):
                check_good(obj, f"tests/fixtures/kube/{path.name}", crds, check)

    for obj in load_docs(here / "bad-objects.yaml"):
        check_bad(obj, "bad-objects.yaml", crds, check)

    schemas = {
        "PodMonitor": json.loads((here / "schemas" / "podmonitor.json").read_text()),
        "SecurityContextConstraints": json.loads((here / "schemas" / "scc.json").read_text()),
    }
    for built in argv[2:]:
        docs = load_docs(built)
        origin = Path(built).name
        for obj in docs:
            if obj.get("apiVersion", "").startswith(GROUP + "/"):
                check_good(obj, origin, crds, check)
        check_foreign(docs, origin, schemas, check)
        problems = daemonset_problems(docs)
        if problems:
            check.fail(f"{origin}: the DaemonSet's flags, mounts and ports agree", problems)
        else:
            check.ok(f"{origin}: the DaemonSet's flags, mounts and ports agree")

    print(f"check_crds: {check.passes} ok, {check.failures} failed")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
