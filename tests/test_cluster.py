"""The Kubernetes manifest and the grading image (cluster/): generated, consistent, as secure as the sandbox allows.

    .venv/bin/python -m pytest -q tests/test_cluster.py

The manifest: `python -m autograder.grade k8s-manifest ASSIGNMENT --shards N` (autograder/grading/k8s.py) writes
the grading Job and the merge Job; the committed cluster/k8s-autograde-job.yaml must be that command's output
(the README's command, run as written). For several N and assignments: the Jobs are valid (required fields, and
Kubernetes' own JSON schemas where kubernetes-validate is installed, as `make install` does), N and the
assignment agree everywhere (completions, parallelism, every `k8s/N`, the merge's files), pod index I is shard
I+1 of N as `--shard k8s/N` reads it (autograder.grading.cli._shard), and the merge names exactly the files those
shards write (classrun.shard_path). Pod Security: a checker of the `restricted` and `baseline` profiles (the
rules of Kubernetes' pod-security-admission, policy version 1.35 and later) finds exactly the rules the README
says the grading pods cannot meet, none for the merge pod, and catches each rule broken on purpose.

The image: cluster/Containerfile's base is pinned by digest, its USER is the manifest's uid, and what it installs
with pip is exactly the runtime set: the course's [project] dependencies and the packages of its extras that
autograder/ imports (read from the source), never a development package. Where docker, podman or buildah is on
PATH and the base image can be had, the image is built and checked (its user, the grading command, no
development package); otherwise that one test is skipped with the reason.
"""

from __future__ import annotations

import ast
import copy
import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib

import pytest
import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from autograder.grading import cli, k8s
from autograder.grading.classrun import shard_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join(ROOT, "cluster", "k8s-autograde-job.yaml")
CONTAINERFILE = os.path.join(ROOT, "cluster", "Containerfile")
README = os.path.join(ROOT, "README.md")
# the committed example: the README's command
EXAMPLE = ["k8s-manifest", "02_tensor_parallel", "--shards", "8", "--out", "cluster/k8s-autograde-job.yaml"]
ASSIGNMENTS = sorted(os.listdir(os.path.join(ROOT, "release")))
# [course]'s development packages (JupyterLab is one too, but nbgrader requires it: it comes with the runtime)
DEV_PACKAGES = ("playwright", "sphinx", "pytest", "megatron", "myst", "furo", "latex2mathml", "jieba")


def _generate(tmp_path, monkeypatch, capsys, *args) -> tuple[str, list[dict]]:
    """The command's output, run in-process outside a course root, and its YAML documents."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["k8s-manifest", *args]) == 0
    text = capsys.readouterr().out
    return text, list(yaml.safe_load_all(text))


def _strings(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)
    elif isinstance(obj, str):
        yield obj


# ---------------------------------------------------------------------------------------------------------------
# The manifest: generated, valid, consistent
# ---------------------------------------------------------------------------------------------------------------

def test_the_committed_manifest_is_the_commands_output(tmp_path):
    """The README's command, run as an instructor runs it (a fresh process, in a folder of its own), writes
    cluster/k8s-autograde-job.yaml byte for byte: the committed example cannot drift from the generator."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-m", "autograder.grade", *EXAMPLE], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "wrote cluster/k8s-autograde-job.yaml" in run.stdout
    with open(tmp_path / "cluster" / "k8s-autograde-job.yaml", encoding="utf-8") as f:
        made = f.read()
    with open(MANIFEST, encoding="utf-8") as f:
        committed = f.read()
    assert made == committed, ("cluster/k8s-autograde-job.yaml is not what `python -m autograder.grade "
                               + " ".join(EXAMPLE) + "` writes: run that command in the course root")
    with open(README, encoding="utf-8") as f:
        readme = f.read()
    assert "autograder.grade " + " ".join(EXAMPLE) in readme, "the README's command is not the one tested here"


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _quantity(text: str) -> float:
    units = {"": 1, "m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", text)
    assert m and m.group(2) in units, f"not a Kubernetes quantity: {text!r}"
    return float(m.group(1)) * units[m.group(2)]


def _check_job_fields(job: dict) -> None:
    """What the API server requires of a batch/v1 Job and its pod (and a few rules of an Indexed Job), checked
    without a cluster."""
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    name = job["metadata"]["name"]
    assert _DNS_LABEL.match(name) and len(name) <= 63, name
    spec = job["spec"]
    for labels in (job["metadata"].get("labels", {}), spec["template"]["metadata"].get("labels", {})):
        for key, value in labels.items():
            assert _LABEL_KEY.match(key) and len(key.split("/")[-1]) <= 63, key
            assert isinstance(value, str) and _LABEL_VALUE.match(value) and len(value) <= 63, value
    for field in ("completions", "parallelism", "backoffLimit"):
        assert isinstance(spec.get(field), int) and spec[field] >= (1 if field != "backoffLimit" else 0), field
    assert spec["parallelism"] <= spec["completions"]
    if spec.get("completionMode") == "Indexed":
        # a pod's host name is <job>-<index>: a DNS label
        assert len(f"{name}-{spec['completions'] - 1}") <= 63
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure"), "a Job's pods never restart Always"
    volumes = {v["name"] for v in pod.get("volumes", [])}
    assert pod["containers"], "a pod needs a container"
    for c in pod["containers"]:
        assert _DNS_LABEL.match(c["name"]) and c["image"], c
        assert isinstance(c["command"], list) and all(isinstance(a, str) for a in c["command"]), c["command"]
        assert c["workingDir"].startswith("/")
        for m in c.get("volumeMounts", []):
            assert m["name"] in volumes and m["mountPath"].startswith("/"), m
        res = c.get("resources", {})
        for kind in ("cpu", "memory"):
            if kind in res.get("requests", {}) and kind in res.get("limits", {}):
                assert _quantity(res["requests"][kind]) <= _quantity(res["limits"][kind])


def _schema_check(doc: dict) -> str:
    """Kubernetes' own OpenAPI schemas (kubernetes-validate, strict: no unknown field), for the oldest release
    whose schema has every field the grading pod sets (appArmorProfile: 1.30) and the newest it knows. Where the
    package is not installed (the [course] extra has it: `make install`), the field checks above are the check."""
    try:
        import kubernetes_validate
        import kubernetes_validate.utils
    except ImportError:
        return "kubernetes-validate not installed: the field checks only"
    versions = [v for v in kubernetes_validate.utils.all_versions() if Version(v) >= Version("1.30")]
    assert versions, "kubernetes-validate has no schema of Kubernetes 1.30 or later"
    for version in (versions[0], versions[-1]):
        kubernetes_validate.validate(doc, version, strict=True)
    return f"Kubernetes' schemas of {versions[0]} and {versions[-1]}"


@pytest.mark.parametrize("assignment,shards", [("02_tensor_parallel", 8), ("01_data_parallel", 1),
                                               ("05_expert_parallel", 3), ("06_composition", 40)])
def test_the_jobs_are_valid_and_every_number_and_name_agrees(tmp_path, monkeypatch, capsys, assignment, shards):
    text, docs = _generate(tmp_path, monkeypatch, capsys, assignment, "--shards", str(shards))
    assert [d["kind"] for d in docs] == ["Job", "Job"]
    grade, merge = docs
    for doc in docs:
        _check_job_fields(doc)
        checked = _schema_check(doc)
        print(assignment, shards, doc["metadata"]["name"], checked)
        if "schemas" in checked:  # and the schemas do refuse a field Kubernetes does not know
            broken = copy.deepcopy(doc)
            broken["spec"]["template"]["spec"]["containers"][0]["securityContext"]["procMountType"] = "Unmasked"
            with pytest.raises(Exception, match="procMountType"):
                _schema_check(broken)
    spec = grade["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == shards and spec["parallelism"] == shards
    assert merge["spec"]["suspend"] is True and merge["spec"]["completions"] == 1
    # every N written anywhere (the Jobs and the header's comments) is --shards
    assert set(re.findall(r"k8s/(\d+)", text)) == {str(shards)}
    assert set(re.findall(r"-of-(\d+)\.json", text)) == {str(shards)}
    # the assignment: in the grading command, the merge's files, the names and labels, and no other one anywhere
    slug = assignment.lower().replace("_", "-")
    assert grade["metadata"]["name"] == f"autograde-{slug}" and merge["metadata"]["name"] == f"autograde-{slug}-merge"
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels == doc["spec"]["template"]["metadata"]["labels"]
        assert labels["llm-parallelism-course/assignment"] == assignment
    others = [a for a in ASSIGNMENTS if a != assignment]
    assert not [a for a in others if a in text or a.lower().replace("_", "-") in text]
    (grade_c,) = grade["spec"]["template"]["spec"]["containers"]
    (merge_c,) = merge["spec"]["template"]["spec"]["containers"]
    assert grade_c["command"][:5] == [".venv/bin/python", "-m", "autograder.grade", "autograde", assignment]
    assert grade_c["command"].count("--shard") == 1
    assert grade_c["command"][grade_c["command"].index("--shard") + 1] == f"k8s/{shards}"
    assert merge_c["command"][:4] == [".venv/bin/python", "-m", "autograder.grade", "merge"]
    assert grade_c["image"] == merge_c["image"] == k8s.DEFAULT_IMAGE
    # both pods: the course volume at the working directory, the image's interpreter through the volume's .venv
    for pod, c in ((grade["spec"]["template"]["spec"], grade_c), (merge["spec"]["template"]["spec"], merge_c)):
        assert c["workingDir"] == "/course" and c["volumeMounts"] == [{"name": "course", "mountPath": "/course"}]
        assert pod["volumes"] == [{"name": "course", "persistentVolumeClaim": {"claimName": k8s.DEFAULT_PVC}}]


@pytest.mark.parametrize("shards", [1, 2, 8, 40])
def test_completion_index_i_grades_shard_i_plus_1_and_the_merge_reads_exactly_those_files(
        tmp_path, monkeypatch, capsys, shards):
    """Kubernetes gives the pods of an Indexed Job the indexes 0..completions-1 in JOB_COMPLETION_INDEX; the pod's
    `--shard k8s/N`, read by the grading command's own parser, must make them the shards 1..N, each once; the merge
    must name exactly the files those shards write (classrun.shard_path, where grade_class saves a shard)."""
    _, (grade, merge) = _generate(tmp_path, monkeypatch, capsys, "02_tensor_parallel", "--shards", str(shards))
    command = grade["spec"]["template"]["spec"]["containers"][0]["command"]
    value = command[command.index("--shard") + 1]
    shards_made = []
    for index in range(grade["spec"]["completions"]):
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(index))
        shards_made.append(cli._shard(value))
    assert shards_made == [(i, shards) for i in range(1, shards + 1)]
    files = merge["spec"]["template"]["spec"]["containers"][0]["command"][4:]
    assert files == [os.path.relpath(shard_path("/course", "02_tensor_parallel", i, n), "/course")
                     for i, n in shards_made]
    assert len(set(files)) == shards
    # an index past the Job's completions is refused by the grading command, not graded as some shard
    monkeypatch.setenv("JOB_COMPLETION_INDEX", str(shards))
    with pytest.raises(Exception, match="between 1 and"):
        cli._shard(value)
    # the grading command's parser accepts both commands as written (it stops after parsing: no course root here)
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "0")
    for argv in (command[3:], merge["spec"]["template"]["spec"]["containers"][0]["command"][3:]):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert "run from the course root" in str(stop.value.code), (argv, stop.value.code)


def test_the_manifest_refuses_what_kubernetes_would(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for args, said in ((["02_tensor_parallel", "--shards", "0"], "at least 1"),
                       (["02_tensor_parallel", "--shards", "2", "--seccomp", "runtime-default"], "--seccomp"),
                       (["02_tensor_parallel", "--shards", "2", "--apparmor", "localhost/"], "--apparmor"),
                       (["a" * 60, "--shards", "2"], "too long"),
                       (["../x", "--shards", "2"], "not an assignment")):
        with pytest.raises(SystemExit) as stop:
            cli.main(["k8s-manifest", *args])
        assert said in str(stop.value.code), (args, stop.value.code)
    # in a course root, only a released assignment
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as stop:
        cli.main(["k8s-manifest", "07_nothing", "--shards", "2"])
    assert "not in release/" in str(stop.value.code)


# ---------------------------------------------------------------------------------------------------------------
# Pod Security Standards
# ---------------------------------------------------------------------------------------------------------------

_BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                  "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
_SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                 "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                 "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                 "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"}
_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim",
                       "projected", "secret"}


def pod_security_violations(template: dict, level: str) -> set[str]:
    """The rules of a Pod Security Standards profile ("baseline" or "restricted") that a pod template breaks, as
    Kubernetes' pod-security-admission checks them at policy version 1.35 and later (its check names, the
    baseline and restricted variants of one rule under one name). Stricter in one place: restricted's runAsNonRoot
    and runAsUser are checked even for a pod with hostUsers: false, which 1.35 exempts."""
    meta, spec = template.get("metadata", {}), template["spec"]
    pod_sc = spec.get("securityContext") or {}
    containers = spec.get("initContainers", []) + spec["containers"] + spec.get("ephemeralContainers", [])
    scs = [c.get("securityContext") or {} for c in containers]
    userns = spec.get("hostUsers") is False
    bad = set()
    # baseline
    if any((s.get("windowsOptions") or {}).get("hostProcess") for s in [pod_sc, *scs]):
        bad.add("hostProcess")
    if any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")):
        bad.add("hostNamespaces")
    if any(s.get("privileged") for s in scs):
        bad.add("privileged")
    if any(set((s.get("capabilities") or {}).get("add") or []) - _BASELINE_CAPS for s in scs):
        bad.add("capabilities")
    if any("hostPath" in v for v in spec.get("volumes", [])):
        bad.add("hostPathVolumes")
    if any(p.get("hostPort") for c in containers for p in c.get("ports", [])):
        bad.add("hostPorts")
    if (any((s.get("appArmorProfile") or {}).get("type", "RuntimeDefault") not in ("RuntimeDefault", "Localhost")
            for s in [pod_sc, *scs])
            or any(k.startswith("container.apparmor.security.beta.kubernetes.io/")
                   and not (v in ("", "runtime/default") or v.startswith("localhost/"))
                   for k, v in (meta.get("annotations") or {}).items())):
        bad.add("appArmorProfile")
    for s in [pod_sc, *scs]:
        o = s.get("seLinuxOptions") or {}
        if o.get("type", "") not in _SELINUX_TYPES or o.get("user") or o.get("role"):
            bad.add("seLinuxOptions")
    unmasked = any(s.get("procMount", "Default") != "Default" for s in scs)
    if unmasked and (level == "restricted" or not userns):  # baseline: any /proc in a user namespace (1.35)
        bad.add("procMount")
    if any((s.get("seccompProfile") or {}).get("type") == "Unconfined" for s in [pod_sc, *scs]):
        bad.add("seccompProfile")
    if any(s["name"] not in _SAFE_SYSCTLS for s in pod_sc.get("sysctls") or []):
        bad.add("sysctls")
    if level == "baseline":
        return bad
    # restricted (its volume rule replaces baseline's hostPath rule, as in pod-security-admission)
    bad.discard("hostPathVolumes")
    if any(set(v) - {"name"} - _RESTRICTED_VOLUMES for v in spec.get("volumes", [])):
        bad.add("restrictedVolumes")
    if any(s.get("allowPrivilegeEscalation") is not False for s in scs):
        bad.add("allowPrivilegeEscalation")
    if (any(s.get("runAsNonRoot") is False for s in [pod_sc, *scs])
            or not (pod_sc.get("runAsNonRoot") is True or all(s.get("runAsNonRoot") is True for s in scs))):
        bad.add("runAsNonRoot")
    if any(s.get("runAsUser") == 0 for s in [pod_sc, *scs]):
        bad.add("runAsUser")
    for s in scs:
        kind = (s.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if kind not in ("RuntimeDefault", "Localhost"):
            bad.add("seccompProfile")
        caps = s.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.add("capabilities")
    return bad


@pytest.mark.parametrize("options,unmet_restricted,unmet_baseline", [
    ([], {"procMount", "seccompProfile", "appArmorProfile"}, {"seccompProfile", "appArmorProfile"}),
    (["--seccomp", "localhost/course-grading.json"], {"procMount", "appArmorProfile"}, {"appArmorProfile"}),
    (["--seccomp", "localhost/course-grading.json", "--apparmor", "unset"], {"procMount"}, set()),
    (["--seccomp", "localhost/course-grading.json", "--apparmor", "localhost/course-grading"], {"procMount"}, set()),
], ids=["default", "seccomp-localhost", "no-apparmor-nodes", "both-localhost"])
def test_pod_security_exactly_the_rules_the_sandbox_needs_are_unmet(tmp_path, monkeypatch, capsys, options,
                                                                     unmet_restricted, unmet_baseline):
    """The grading pods break only the `restricted` rules the README names (k8s.RESTRICTED_EXCEPTIONS: an
    unmasked /proc always; seccomp and AppArmor unconfined unless the cluster has profiles of its own), and the
    manifest's header says so; the merge pod meets the whole profile."""
    text, (grade, merge) = _generate(tmp_path, monkeypatch, capsys, "02_tensor_parallel", "--shards", "4",
                                     *options)
    template = grade["spec"]["template"]
    assert pod_security_violations(template, "restricted") == unmet_restricted
    assert pod_security_violations(template, "baseline") == unmet_baseline
    assert pod_security_violations(merge["spec"]["template"], "restricted") == set()
    seccomp = options[options.index("--seccomp") + 1] if "--seccomp" in options else "unconfined"
    apparmor = options[options.index("--apparmor") + 1] if "--apparmor" in options else "unconfined"
    assert set(k8s.restricted_exceptions(seccomp, apparmor)) == unmet_restricted
    header = " ".join(line[2:] for line in text.split("\n---\n")[0].splitlines())
    for rule, why in k8s.RESTRICTED_EXCEPTIONS.items():
        assert (" ".join(why.split()) in " ".join(header.split())) == (rule in unmet_restricted), rule
    # what the sandbox needs is there: a user namespace for the pod, no capability, the uid of the image's user
    pod = template["spec"]
    assert pod["hostUsers"] is False
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["runAsGroup"] == k8s.UID
    assert pod["containers"][0]["securityContext"]["procMount"] == "Unmasked"
    with open(README, encoding="utf-8") as f:
        readme = " ".join(f.read().split())
    for rule in unmet_restricted:  # the README says why each rule is not met
        assert f"`{rule}`" in readme, rule


def _sc(p, i=None):
    return p["spec"]["securityContext"] if i is None else p["spec"]["containers"][i]["securityContext"]


# a rule broken on purpose: the rule `restricted` then reports, and the one `baseline` reports (None: none)
_BROKEN = {
    "runAsNonRoot": (lambda p: _sc(p).update(runAsNonRoot=False), "runAsNonRoot", None),
    "runAsUser": (lambda p: _sc(p).update(runAsUser=0), "runAsUser", None),
    "allowPrivilegeEscalation": (lambda p: _sc(p, 0).pop("allowPrivilegeEscalation"), "allowPrivilegeEscalation",
                                 None),
    "capabilities add": (lambda p: _sc(p, 0)["capabilities"].update(add=["SYS_ADMIN"]), "capabilities",
                         "capabilities"),
    "capabilities drop": (lambda p: _sc(p, 0)["capabilities"].update(drop=["NET_RAW"]), "capabilities", None),
    "privileged": (lambda p: _sc(p, 0).update(privileged=True), "privileged", "privileged"),
    "hostPID": (lambda p: p["spec"].update(hostPID=True), "hostNamespaces", "hostNamespaces"),
    "hostPath": (lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
                 "restrictedVolumes", "hostPathVolumes"),
    "nfs": (lambda p: p["spec"]["volumes"].append({"name": "n", "nfs": {"server": "s", "path": "/"}}),
            "restrictedVolumes", None),
    "seccomp unset": (lambda p: _sc(p).pop("seccompProfile"), "seccompProfile", None),
    "seccomp unconfined": (lambda p: _sc(p, 0).update(seccompProfile={"type": "Unconfined"}), "seccompProfile",
                           "seccompProfile"),
    "hostPort": (lambda p: p["spec"]["containers"][0].update(ports=[{"containerPort": 80, "hostPort": 80}]),
                 "hostPorts", "hostPorts"),
    "seLinux": (lambda p: _sc(p).update(seLinuxOptions={"type": "spc_t"}), "seLinuxOptions", "seLinuxOptions"),
    "sysctl": (lambda p: _sc(p).update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]), "sysctls", "sysctls"),
    "procMount": (lambda p: _sc(p, 0).update(procMount="Unmasked"), "procMount", "procMount"),
    "procMount in a user namespace": (lambda p: (_sc(p, 0).update(procMount="Unmasked"),
                                                 p["spec"].update(hostUsers=False)), "procMount", None),
    "appArmor": (lambda p: _sc(p).update(appArmorProfile={"type": "Unconfined"}), "appArmorProfile",
                 "appArmorProfile"),
}


def test_the_pod_security_checker_catches_each_rule_broken_on_purpose(tmp_path, monkeypatch, capsys):
    """The checker is not vacuous: the merge pod (which meets `restricted`) with one rule broken breaks exactly
    that rule, in `baseline` too where that profile has it."""
    _, (_, merge) = _generate(tmp_path, monkeypatch, capsys, "02_tensor_parallel", "--shards", "2")
    for what, (breaks, restricted, baseline) in _BROKEN.items():
        template = copy.deepcopy(merge["spec"]["template"])
        breaks(template)
        assert pod_security_violations(template, "restricted") == {restricted}, what
        assert pod_security_violations(template, "baseline") == ({baseline} if baseline else set()), what


# ---------------------------------------------------------------------------------------------------------------
# The image
# ---------------------------------------------------------------------------------------------------------------

def _instructions() -> list[tuple[str, str]]:
    """cluster/Containerfile's instructions (kind, arguments), continuation lines joined, comments dropped."""
    with open(CONTAINERFILE, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out, cur = [], ""
    for raw in lines:
        if raw.lstrip().startswith("#"):
            continue
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        cur = (cur + raw).strip()
        if cur:
            kind, _, rest = cur.partition(" ")
            out.append((kind.upper(), rest.strip()))
        cur = ""
    return out


_PIP_OPTION_VALUES = {"--index-url", "-i", "--extra-index-url", "--trusted-host", "--find-links", "-f"}


def _pip_installs() -> list[str]:
    """Every requirement that a `pip install` of the Containerfile names (pip's own upgrade aside)."""
    reqs = []
    for kind, rest in _instructions():
        if kind != "RUN":
            continue
        for part in re.split(r"&&|;|\|\|", rest):
            words = shlex.split(part)
            if len(words) < 2 or not (words[0].endswith("pip") and words[1] == "install"):
                continue
            assert not {"-r", "--requirement", "-e", "--editable"} & set(words), \
                "the Containerfile names its packages on the command line, not in a file or editable"
            skip = False
            for w in words[2:]:
                if skip:
                    skip = False
                elif w in _PIP_OPTION_VALUES:
                    skip = True
                elif not w.startswith("-") and not (w == "pip" and "--upgrade" in words):
                    reqs.append(w)
    return reqs


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _imported_distributions() -> set[str]:
    """The distributions whose modules autograder/ imports (any import, at module level or in a function)."""
    modules = set()
    for folder, _, names in os.walk(os.path.join(ROOT, "autograder")):
        for name in names:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        modules |= {a.name.split(".")[0] for a in node.names}
                    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                        modules.add(node.module.split(".")[0])
    modules -= set(sys.stdlib_module_names) | {"autograder"}
    owners = importlib.metadata.packages_distributions()
    return {canonicalize_name(d) for m in modules for d in owners.get(m, [])}


def _runtime_set() -> dict[str, list[Requirement]]:
    """What grading needs installed: the [project] dependencies, and the requirements of any extra whose
    distribution autograder/ imports; name -> the declared requirements."""
    project = _pyproject()
    imported = _imported_distributions()
    runtime: dict[str, list[Requirement]] = {}
    for text in project["dependencies"]:
        r = Requirement(text)
        runtime.setdefault(canonicalize_name(r.name), []).append(r)
    for extra in project.get("optional-dependencies", {}).values():
        for text in extra:
            r = Requirement(text)
            if canonicalize_name(r.name) in imported:
                runtime.setdefault(canonicalize_name(r.name), []).append(r)
    return runtime


def _installed_set() -> dict[str, Requirement | None]:
    """The Containerfile's pip installs: name -> the requirement as written (None: from the course's own
    [project] dependencies, the course itself installed from /tmp/course)."""
    project = _pyproject()
    out: dict[str, Requirement | None] = {}
    for word in _pip_installs():
        course = re.fullmatch(r"/tmp/course(?:\[([^\]]*)\])?", word)
        if course:
            reqs = list(project["dependencies"])
            for extra in filter(None, (course.group(1) or "").split(",")):
                reqs += project["optional-dependencies"][extra.strip()]
            for text in reqs:
                out.setdefault(canonicalize_name(Requirement(text).name), None)
        else:
            r = Requirement(word)
            out[canonicalize_name(r.name)] = r
    return out


def test_the_image_installs_exactly_the_runtime_set():
    runtime, installed = _runtime_set(), _installed_set()
    assert set(installed) == set(runtime), (
        f"cluster/Containerfile installs {sorted(installed)}; grading needs {sorted(runtime)} (the [project] "
        f"dependencies and the extras' packages autograder/ imports): missing {sorted(set(runtime) - set(installed))}, "
        f"extra {sorted(set(installed) - set(runtime))}")
    for name, req in installed.items():
        if req is not None:  # written out: with a specifier declared in pyproject.toml
            assert any(str(req.specifier) == str(d.specifier) for d in runtime[name]), (
                f"the Containerfile's {req} is not what pyproject.toml declares: {[str(d) for d in runtime[name]]}")
    # nothing of the development extra; and the rest of what autograder/ imports comes with the runtime set
    assert not [p for p in DEV_PACKAGES for name in installed if p in name]
    run_text = " ".join(rest.lower() for kind, rest in _instructions() if kind == "RUN")
    assert not [p for p in (*DEV_PACKAGES, "jupyterlab") if p in run_text] and "[course]" not in run_text
    environment = dict(default_environment(), extra="")
    closure, todo = set(), list(runtime)
    while todo:
        name = todo.pop()
        if name in closure:
            continue
        closure.add(name)
        for text in importlib.metadata.requires(name) or []:
            r = Requirement(text)
            if r.marker is None or r.marker.evaluate(environment):
                todo.append(canonicalize_name(r.name))
    assert _imported_distributions() <= closure, _imported_distributions() - closure


def test_the_image_is_pinned_and_runs_as_the_manifests_user():
    steps = _instructions()
    froms = [rest for kind, rest in steps if kind == "FROM"]
    assert froms and all(re.match(r"^\S+@sha256:[0-9a-f]{64}(\s+AS\s+\S+)?$", f, re.I) for f in froms), froms
    assert froms[0].startswith("debian:12-slim@")
    users = [rest for kind, rest in steps if kind == "USER"]
    assert users, "the image must not run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and gid.isdigit(), "a numeric USER: the kubelet verifies runAsNonRoot from it"
    with open(MANIFEST, encoding="utf-8") as f:
        docs = list(yaml.safe_load_all(f))
    for doc in docs:
        sc = doc["spec"]["template"]["spec"]["securityContext"]
        assert (sc["runAsUser"], sc["runAsGroup"]) == (int(uid), int(gid)) == (k8s.UID, k8s.UID)
    run_text = " ".join(rest for kind, rest in steps if kind == "RUN")
    assert f"groupadd --gid {gid} " in run_text and f"useradd --uid {uid} --gid {gid} " in run_text
    apt = re.search(r"apt-get install ([^&]*)", run_text).group(1).split()
    assert "bubblewrap" in apt and "python3" in apt
    with open(CONTAINERFILE, encoding="utf-8") as f:
        doc = f.read()
    # the sandbox's needs are written down in the file
    for need in ("bubblewrap", "user.max_user_namespaces", "procMount: Unmasked", "hostUsers: false",
                 "seccompProfile", "AppArmor", "cgroup"):
        assert need in doc, need


def _builder() -> tuple[str | None, str]:
    """(a container builder whose base image is here or can be pulled, the reason when none)."""
    digest_ref = next(rest for kind, rest in _instructions() if kind == "FROM").split()[0]
    why = []
    for tool in ("docker", "podman", "buildah"):
        path = shutil.which(tool)
        if path is None:
            why.append(f"no {tool}")
            continue
        probe = {"docker": [path, "info"], "podman": [path, "info"], "buildah": [path, "version"]}[tool]
        try:
            ok = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            why.append(f"{tool} did not answer within 30 s")
            continue
        if ok.returncode != 0:
            why.append(f"{tool} cannot run: {(ok.stderr or ok.stdout).strip().splitlines()[-1:]}")
            continue
        have = ([path, "image", "inspect", digest_ref] if tool != "buildah"
                else [path, "inspect", "--type", "image", digest_ref])
        if subprocess.run(have, capture_output=True, timeout=60).returncode == 0:
            return tool, ""
        try:
            pulled = subprocess.run([path, "pull", digest_ref], capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            why.append(f"{tool} could not pull {digest_ref} within 600 s")
            continue
        if pulled.returncode == 0:
            return tool, ""
        why.append(f"{tool} has no {digest_ref} and cannot pull it: "
                   f"{(pulled.stderr or pulled.stdout).strip().splitlines()[-1:]}")
    return None, "; ".join(why)


@pytest.mark.timeout(3600)
def test_the_image_builds_and_grades_as_its_user():
    """Build cluster/Containerfile from the course root as the README says, then: it runs as uid 1000, the
    grading command answers, bubblewrap is there, and no development package is installed."""
    tool, why = _builder()
    if tool is None:
        pytest.skip(f"no container builder with the base image here: {why}")
    tag = f"localhost/llm-parallelism-course:test-{os.getpid()}"
    path = shutil.which(tool)
    build = ([path, "build", "-f", "cluster/Containerfile", "-t", tag, "."] if tool != "buildah"
             else [path, "bud", "-f", "cluster/Containerfile", "-t", tag, "."])
    made = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert made.returncode == 0, made.stdout[-4000:] + made.stderr[-4000:]
    try:
        def run(*argv: str) -> str:
            if tool == "buildah":
                ctr = subprocess.run([path, "from", tag], capture_output=True, text=True, check=True).stdout.strip()
                try:
                    cmd = [path, "run", ctr, "--", *argv]
                    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
                finally:
                    subprocess.run([path, "rm", ctr], capture_output=True)
            cmd = [path, "run", "--rm", tag, *argv]
            return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
        assert run("id", "-u").strip() == str(k8s.UID) and run("id", "-g").strip() == str(k8s.UID)
        assert "autograde" in run("python", "-m", "autograder.grade", "--help")
        assert run("sh", "-c", "command -v bwrap").strip()
        installed = {canonicalize_name(line.split("==")[0])
                     for line in run("pip", "freeze").splitlines() if "==" in line}
        assert set(_runtime_set()) <= installed
        assert not [p for p in DEV_PACKAGES for name in installed if p in name], installed
    finally:
        subprocess.run([path, "rmi", tag], capture_output=True)
