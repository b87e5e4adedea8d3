"""The Kubernetes manifest for grading one assignment of a class: an Indexed Job of N shards, then the merge.

    python -m autograder.grade k8s-manifest 02_tensor_parallel --shards 8 --out cluster/k8s-autograde-job.yaml
    python -m autograder.grade k8s-manifest 02_tensor_parallel --shards 8 --image REGISTRY/IMAGE@sha256:... \\
        --pvc my-course-volume --seccomp localhost/course-grading.json --apparmor unset

Every number and name that must agree is written from one place: the assignment and N give the grading Job
(`completions` and `parallelism` N, `completionMode: Indexed`, each pod's `--shard k8s/N`, which
autograder.grading.cli reads as shard JOB_COMPLETION_INDEX + 1 of N) and the merge Job, whose command names
exactly the N shard files (`classrun.shard_path`, where `--shard` writes them). The merge Job is created
suspended: it runs when the instructor resumes it after the grading Job completed (a merge of a missing shard
file fails; one of an earlier run's would fold in old records). tests/test_cluster.py checks the structure, the
index-to-shard mapping, the Pod Security settings and that cluster/k8s-autograde-job.yaml is this command's
output.

Pod Security (`restricted` profile): the grading pods meet every rule but `procMount` (bubblewrap mounts a fresh
/proc for each submission's PID namespace, which the kernel allows a user namespace only where no part of the
container's /proc is masked; the profile allows no Unmasked /proc, even with `hostUsers: false`), and, unless
the cluster has profiles of its own that allow what bubblewrap needs (`--seccomp localhost/...`,
`--apparmor localhost/...` or `unset` on nodes without AppArmor), `seccompProfile` and `appArmorProfile`
(RESTRICTED_EXCEPTIONS says why). The merge pods meet all of it. README, "For instructors", the Kubernetes
paragraph.
"""

from __future__ import annotations

import json
import os
import re
import shlex

from autograder.grading.classrun import shard_path

DEFAULT_IMAGE = "registry.example.org/llm-parallelism-course:latest"
DEFAULT_PVC = "llm-parallelism-course"
MOUNT = "/course"  # the course root, a ReadWriteMany volume, in every pod
PYTHON = ".venv/bin/python"  # in /course: the volume's .venv, a symlink to the image's /opt/venv
UID = 1000  # cluster/Containerfile's `grader` user (USER 1000:1000): the pods' runAsUser and runAsGroup
JOBS = 4  # submissions graded at once per pod (its --jobs): its CPUs
GIB_PER_JOB = 4  # the grading command's --memory default: one submission's memory
APP = "llm-parallelism-course"

# The `restricted` rules a grading pod cannot meet with these settings, and why (README, the Kubernetes paragraph).
RESTRICTED_EXCEPTIONS = {
    "procMount": "procMount: Unmasked: bubblewrap mounts a fresh /proc for each submission's PID namespace, and the "
                 "kernel lets a user namespace mount /proc only where no part of the container's /proc is masked "
                 "(measured: 'Can't mount proc on /newroot/proc'); `restricted` allows only the Default /proc, "
                 "even with hostUsers: false (`baseline` allows Unmasked there, policy version 1.35 and later)",
    "seccompProfile": "seccompProfile: Unconfined: the runtime's default profile (Docker's measured, containerd's "
                      "read in its source) allows unshare, clone with namespace flags, mount and pivot_root only "
                      "with CAP_SYS_ADMIN, which bubblewrap's unprivileged mode does not have; a Localhost profile "
                      "that allows them meets the rule (--seccomp localhost/PATH)",
    "appArmorProfile": "appArmorProfile: Unconfined: the default AppArmor profiles of Docker and containerd deny "
                       "mount (read in their sources); on nodes without AppArmor, --apparmor unset meets the rule, "
                       "and a Localhost profile that allows mount does elsewhere (--apparmor localhost/NAME)",
}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ManifestError(ValueError):
    """Options that make no valid manifest."""


def job_names(assignment: str) -> tuple[str, str]:
    """(the grading Job, the merge Job): DNS-1123 labels made of the assignment's name."""
    slug = re.sub(r"[^a-z0-9-]+", "-", assignment.lower()).strip("-")
    return f"autograde-{slug}", f"autograde-{slug}-merge"


def grade_command(assignment: str, shards: int, jobs: int = JOBS) -> list[str]:
    return [PYTHON, "-m", "autograder.grade", "autograde", assignment, "--shard", f"k8s/{shards}",
            "--jobs", str(jobs), "--quiet"]


def shard_files(assignment: str, shards: int) -> list[str]:
    """The N shard files, relative to the course root: what the pods of index 0..N-1 write."""
    return [os.path.relpath(shard_path(MOUNT, assignment, i, shards), MOUNT) for i in range(1, shards + 1)]


def merge_command(assignment: str, shards: int) -> list[str]:
    return [PYTHON, "-m", "autograder.grade", "merge", *shard_files(assignment, shards)]


def restricted_exceptions(seccomp: str = "unconfined", apparmor: str = "unconfined") -> list[str]:
    """The `restricted` rules the grading pods do not meet with these options (RESTRICTED_EXCEPTIONS's keys)."""
    return (["procMount"] + (["seccompProfile"] if seccomp == "unconfined" else [])
            + (["appArmorProfile"] if apparmor == "unconfined" else []))


def _profile(option: str, value: str, allowed: tuple[str, ...]) -> dict | None:
    if value == "unset" and "unset" in allowed:
        return None
    if value == "unconfined":
        return {"type": "Unconfined"}
    if value.startswith("localhost/") and value != "localhost/":
        return {"type": "Localhost", "localhostProfile": value[len("localhost/"):]}
    raise ManifestError(f"--{option} {value}: one of {', '.join(allowed)} or localhost/NAME")


def build(assignment: str, shards: int, *, image: str = DEFAULT_IMAGE, pvc: str = DEFAULT_PVC, jobs: int = JOBS,
          seccomp: str = "unconfined", apparmor: str = "unconfined") -> list[dict]:
    """The grading Job and the merge Job, as plain data (what `render` writes)."""
    if not _NAME.match(assignment):
        raise ManifestError(f"{assignment!r} is not an assignment's folder name")
    if shards < 1:
        raise ManifestError(f"--shards {shards}: at least 1")
    if jobs < 1:
        raise ManifestError(f"--jobs {jobs}: at least 1")
    grade_name, merge_name = job_names(assignment)
    # an Indexed Job's pods are named (and their host names are) <job>-<index>: a DNS label of at most 63
    if len(f"{merge_name}") > 63 or len(f"{grade_name}-{shards - 1}") > 63:
        raise ManifestError(f"the Jobs' names ({grade_name}, {merge_name}) are too long for Kubernetes (63)")
    seccomp_profile = _profile("seccomp", seccomp, ("unconfined",))
    apparmor_profile = _profile("apparmor", apparmor, ("unconfined", "unset"))

    def labels(component: str) -> dict:
        return {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": component,
                f"{APP}/assignment": assignment}

    volume = {"name": "course", "persistentVolumeClaim": {"claimName": pvc}}
    mount = {"name": "course", "mountPath": MOUNT}
    user = {"runAsUser": UID, "runAsGroup": UID, "runAsNonRoot": True,
            "fsGroup": UID}  # the course volume: the pods write graded/ and feedback/
    locked = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}

    grade_pod = {"hostUsers": False,  # a user namespace for the pod: what procMount: Unmasked requires
                 "securityContext": {**user, "seccompProfile": seccomp_profile},
                 "restartPolicy": "Never",
                 "containers": [{
                     "name": "grade", "image": image, "workingDir": MOUNT,
                     "command": grade_command(assignment, shards, jobs),
                     "resources": {"requests": {"cpu": str(jobs), "memory": f"{GIB_PER_JOB * jobs}Gi"},
                                   "limits": {"cpu": str(jobs), "memory": f"{GIB_PER_JOB * jobs}Gi"}},
                     "securityContext": {**locked, "procMount": "Unmasked"},
                     "volumeMounts": [mount]}],
                 "volumes": [volume]}
    if apparmor_profile is not None:
        grade_pod["securityContext"]["appArmorProfile"] = apparmor_profile
    grade = {"apiVersion": "batch/v1", "kind": "Job",
             "metadata": {"name": grade_name, "labels": labels("grade")},
             "spec": {"completionMode": "Indexed", "completions": shards, "parallelism": shards,
                      "backoffLimit": 2,
                      "template": {"metadata": {"labels": labels("grade")}, "spec": grade_pod}}}
    merge_pod = {"securityContext": {**user, "seccompProfile": {"type": "RuntimeDefault"}},
                 "restartPolicy": "Never",
                 "containers": [{
                     "name": "merge", "image": image, "workingDir": MOUNT,
                     "command": merge_command(assignment, shards),
                     "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}},
                     "securityContext": locked,
                     "volumeMounts": [mount]}],
                 "volumes": [volume]}
    merge = {"apiVersion": "batch/v1", "kind": "Job",
             "metadata": {"name": merge_name, "labels": labels("merge")},
             "spec": {"suspend": True, "completions": 1, "parallelism": 1, "backoffLimit": 2,
                      "template": {"metadata": {"labels": labels("merge")}, "spec": merge_pod}}}
    return [grade, merge]


# -- YAML: block style, strings quoted wherever a plain scalar could be read as something else -----------------

_PLAIN = re.compile(r"^[A-Za-z_./][A-Za-z0-9_./-]*(:[A-Za-z0-9_./-]+)*$")
_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def _scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return v if _PLAIN.match(v) and v.lower() not in _WORDS else json.dumps(v)
    raise TypeError(f"no YAML for {v!r}")


def _flow(v) -> str | None:
    """A short mapping or list of scalars on one line, else None."""
    if isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    if isinstance(v, dict) and v and all(not isinstance(x, (dict, list)) for x in v.values()):
        text = "{" + ", ".join(f"{_scalar(k)}: {_scalar(x)}" for k, x in v.items()) + "}"
        return text if len(text) <= 60 else None
    return None


def _lines(obj: dict, indent: int) -> list[str]:
    pad, out = " " * indent, []
    for k, v in obj.items():
        flow = _flow(v) if isinstance(v, (dict, list)) else None
        if not isinstance(v, (dict, list)):
            out.append(f"{pad}{_scalar(k)}: {_scalar(v)}")
        elif flow is not None and (isinstance(v, dict) or len(pad) + len(k) + len(flow) <= 116):
            out.append(f"{pad}{_scalar(k)}: {flow}")
        elif isinstance(v, dict):
            out.append(f"{pad}{_scalar(k)}:")
            out += _lines(v, indent + 2)
        elif all(not isinstance(x, (dict, list)) for x in v):  # a long list of scalars: one item a line
            out.append(f"{pad}{_scalar(k)}:")
            out += [f"{pad}  - {_scalar(x)}" for x in v]
        else:
            out.append(f"{pad}{_scalar(k)}:")
            for item in v:
                inner = _lines(item, indent + 4)
                out.append(f"{pad}  - {inner[0].lstrip()}")
                out += inner[1:]
    return out


def render(docs: list[dict], argv: list[str], exceptions: list[str], out: str | None = None) -> str:
    """The manifest file: a header that says how it was made (argv: the command's arguments), how to run it and
    which `restricted` rules the grading pods do not meet (`restricted_exceptions`), then the two Jobs."""
    grade, merge = docs
    assignment = grade["metadata"]["labels"][f"{APP}/assignment"]
    shards = grade["spec"]["completions"]
    pod = grade["spec"]["template"]["spec"]
    path = out or "MANIFEST.yaml"
    command = " ".join(shlex.quote(a) for a in [PYTHON, "-m", "autograder.grade", *argv])
    pattern = shard_files(assignment, shards)[0].replace("shard-1-", "shard-<I+1>-")
    grade_name, merge_name = grade["metadata"]["name"], merge["metadata"]["name"]
    claim = pod["volumes"][0]["persistentVolumeClaim"]["claimName"]
    head = [
        "Made in the course root by",
        f"  {command}",
        "Change that command's options, not this file (tests/test_cluster.py checks that the committed example is "
        "the command's output).",
        "",
        f"Grades {assignment} for the whole class in {shards} shard{'s' if shards > 1 else ''}, then merges them "
        "into the gradebook; where kubectl reaches the cluster:",
        "",
        f"  kubectl delete -f {path} --ignore-not-found   # an earlier run's Jobs (a Job runs once)",
        f"  kubectl apply -f {path}                       # both Jobs, the merge Job suspended",
        f"  kubectl wait --for=condition=complete job/{grade_name} --timeout=2h",
        f"  kubectl patch job/{merge_name} --type=merge -p '{{\"spec\":{{\"suspend\":false}}}}'",
        f"  kubectl wait --for=condition=complete job/{merge_name} --timeout=30m",
        "",
        f"The grading Job's pod of index I (JOB_COMPLETION_INDEX, 0 to {shards - 1}) grades shard I+1 of {shards} "
        f"(`--shard k8s/{shards}`) into {pattern} and the feedback it made, never the gradebook; the merge Job "
        "folds exactly those files in and writes the gradebook. The course root (notebooks, autograder/, "
        f"submitted/, graded/, feedback/, the gradebook) is the ReadWriteMany volume of the claim {claim}, at "
        f"{MOUNT}; the image (cluster/Containerfile) is the environment, /opt/venv, and the volume's .venv a "
        f"symlink to it, made once: ln -s /opt/venv <the volume's course root>/.venv. So `{PYTHON}` in {MOUNT} is "
        "the image's interpreter running the volume's autograder/.",
        "",
        f"Pod Security: every pod runs as uid {UID} (the image's user), with no capability, no privilege "
        "escalation and no volume but the claim; each submission's sandbox is bubblewrap in its unprivileged mode. "
        "The merge pod meets the `restricted` profile; the grading pods meet all of it but (README, \"For "
        "instructors\", the Kubernetes paragraph):",
    ]
    head += [f"- {RESTRICTED_EXCEPTIONS[rule]}" for rule in exceptions]
    head += ["The nodes' kernel must allow unprivileged user namespaces (user.max_user_namespaces > 0). Before "
             "grading, each grading pod probes a sandbox and, where none can be made, stops within seconds (exit "
             "status 1) with bubblewrap's message and the setting likely missing."]
    text = []
    for line in head:
        text += _wrap(line)
    body = []
    for doc, title in ((grade, f"1. grade: {shards} pods, shard k8s/{shards} each"),
                       (merge, "2. merge: created suspended; resume it once the grading Job is complete")):
        body += ["---", f"# {title}", *_lines(doc, 0)]
    return "\n".join(text + body) + "\n"


def _wrap(line: str, width: int = 118) -> list[str]:
    """A comment line, wrapped at words (indented continuation under a list item)."""
    if len(line) + 2 <= width or line.startswith("  "):
        return [f"# {line}".rstrip()]
    out, cur, indent = [], "", "  " if line.startswith("- ") else ""
    for word in line.split(" "):
        if cur and len(cur) + 1 + len(word) + 2 > width:
            out.append(f"# {cur}")
            cur = indent + word
        else:
            cur = f"{cur} {word}" if cur else word
    out.append(f"# {cur}")
    return out


# -- the subcommand --------------------------------------------------------------------------------------------

def add_parser(sub) -> None:
    p = sub.add_parser("k8s-manifest", help="write the Kubernetes Jobs that grade ASSIGNMENT in N shards and merge "
                                            "them (cluster/k8s-autograde-job.yaml is one)")
    p.add_argument("assignment")
    p.add_argument("--shards", type=int, required=True, help="N: the grading Job's pods, one shard each")
    p.add_argument("--image", default=DEFAULT_IMAGE, help=f"cluster/Containerfile's image (default {DEFAULT_IMAGE})")
    p.add_argument("--pvc", default=DEFAULT_PVC,
                   help=f"the ReadWriteMany PersistentVolumeClaim holding the course root (default {DEFAULT_PVC})")
    p.add_argument("--jobs", type=int, default=JOBS,
                   help=f"submissions graded at once per pod: its CPUs, and {GIB_PER_JOB} GiB of memory each "
                        f"(default {JOBS})")
    p.add_argument("--seccomp", default="unconfined",
                   help="the grading pods' seccomp profile: unconfined (default), or localhost/PATH, a profile on "
                        "every node that allows what bubblewrap needs (README)")
    p.add_argument("--apparmor", default="unconfined",
                   help="the grading pods' AppArmor profile: unconfined (default), unset (nodes without AppArmor), "
                        "or localhost/NAME, a profile that allows mount (README)")
    p.add_argument("--out", default=None, help="write the manifest to this file (default: standard output)")


def run(args) -> int:
    """`k8s-manifest`: needs no course root; in one, the assignment must be a released one."""
    released = os.path.join(os.getcwd(), "release")
    if (os.path.exists(os.path.join(os.getcwd(), "nbgrader_config.py")) and os.path.isdir(released)
            and not os.path.isdir(os.path.join(released, args.assignment))):
        raise SystemExit(f"autograder.grade: {args.assignment} is not in release/ (released: "
                         f"{', '.join(sorted(os.listdir(released))) or 'none'})")
    try:
        docs = build(args.assignment, args.shards, image=args.image, pvc=args.pvc, jobs=args.jobs,
                     seccomp=args.seccomp, apparmor=args.apparmor)
    except ManifestError as exc:
        raise SystemExit(f"autograder.grade: {exc}") from None
    argv = [args.assignment, "--shards", str(args.shards)]
    for option, default in (("image", DEFAULT_IMAGE), ("pvc", DEFAULT_PVC), ("jobs", JOBS),
                            ("seccomp", "unconfined"), ("apparmor", "unconfined")):
        if getattr(args, option) != default:
            argv += [f"--{option}", str(getattr(args, option))]
    if args.out:
        argv += ["--out", args.out]
    text = render(docs, ["k8s-manifest", *argv], restricted_exceptions(args.seccomp, args.apparmor), args.out)
    if args.out is None:
        print(text, end="")
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(args.out + ".tmp", args.out)
    grade_name, merge_name = job_names(args.assignment)
    print(f"wrote {args.out}: Jobs {grade_name} ({args.shards} shards) and {merge_name} (suspended); "
          f"`kubectl apply -f {args.out}`, then as its header says")
    return 0
