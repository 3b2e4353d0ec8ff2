"""Running checkov's Kubernetes checks on rendered manifests, and the accepted findings of deploy/README.md.

checkov scans the core kinds it knows; the pods of a RayJob or RayService live inside the custom
resources, where it does not look. So each Ray pod template (head, every worker group, the
RayJob's submitter) is also handed to it as a Pod named <resource>-<group>, and the scan covers
every pod the deployment starts, bar the ones KubeRay adds itself (see deploy/README.md).

checkov lives in a venv of its own (.venv-checkov, built by scripts/setup.sh --dev): its pins
(packaging 23, networkx 2.6, ...) would downgrade the project's own dependencies.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml
from k8s_render import REPO, ray_cluster_specs, ray_pod_groups
from required_tools import checkov_command

README = REPO / "deploy" / "README.md"


@dataclass(frozen=True)
class Accepted:
    """One row of the accepted-findings table in deploy/README.md."""

    check: str  # checkov check id, e.g. CKV_K8S_21
    resource: str  # fnmatch pattern over "<Kind>/<name>" as the scan names it
    reason: str  # why it is accepted (must not be empty)


def scan_input(manifests: list[dict]) -> list[dict]:
    """The manifests plus one Pod per Ray pod template (which checkov would not see inside the CRs)."""
    pods = []
    for doc in manifests:
        if doc["kind"] not in ("RayJob", "RayService"):
            continue
        templates = {
            group: spec["template"]
            for (_, cluster) in ray_cluster_specs([doc]).items()
            for group, spec in ray_pod_groups(cluster).items()
        }
        if "submitterPodTemplate" in doc["spec"]:
            templates["submitter"] = doc["spec"]["submitterPodTemplate"]
        for group, template in templates.items():
            pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{doc['metadata']['name']}-{group}",
                        "labels": template["metadata"]["labels"],
                    },
                    "spec": template["spec"],
                }
            )
    return manifests + pods


def findings(manifests: list[dict], workdir: Path) -> list[tuple[str, str, str]]:
    """(check id, "<Kind>/<name>", check name) of every failed check."""
    path = workdir / "scan.yaml"
    path.write_text(yaml.safe_dump_all(scan_input(manifests)))
    result = subprocess.run(
        [
            *checkov_command(),
            "--file",
            str(path),
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--compact",
            "--quiet",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.stdout.strip(), f"checkov produced no report (exit {result.returncode}):\n{result.stderr[-3000:]}"
    reports = json.loads(result.stdout)
    failed = []
    for report in reports if isinstance(reports, list) else [reports]:
        assert report["summary"]["parsing_errors"] == 0, report["summary"]
        for check in report["results"]["failed_checks"]:
            kind, _namespace, name = check["resource"].split(".", 2)
            failed.append((check["check_id"], f"{kind}/{name}", check["check_name"]))
    return failed


def accepted_findings() -> list[Accepted]:
    """The table between the accepted-findings markers of deploy/README.md."""
    text = README.read_text()
    match = re.search(r"<!-- accepted-findings:start -->(.*?)<!-- accepted-findings:end -->", text, re.S)
    assert match, "deploy/README.md has no accepted-findings table"
    rows = []
    for line in match.group(1).splitlines():
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"CKV2?_K8S_\d+", cells[0]):
            assert cells[2], f"accepted finding {cells[0]} {cells[1]} gives no reason"
            rows.append(Accepted(*cells))
    return rows


def unaccepted(failed: list[tuple[str, str, str]], accepted: list[Accepted]) -> list[tuple[str, str, str]]:
    return [f for f in failed if not any(a.check == f[0] and fnmatch.fnmatchcase(f[1], a.resource) for a in accepted)]
