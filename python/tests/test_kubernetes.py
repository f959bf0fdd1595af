"""The Kubernetes steps of docs/multi-host.md and the manifests in deploy/kubernetes, checked
for real without a cluster (issue 43 item 6): every manifest parses; the `kubectl` steps name
files that exist, in an order that works, and the labels and names the manifests expect; every
stoker container's command runs as written with the real binaries on its ConfigMap's
stoker.toml (paths and ports moved into a temp folder), its readiness probe passes against that
daemon, its liveness path is served on the port the probe names, and the worker's Secret,
made as the comment in workers.yaml says, is where its config reads it. What needs a cluster
(scheduling, the kubelet's mounts and probes, the NVIDIA runtime, the network policy) is not
checked here: docs/multi-host.md, "What the tests check", says so."""

import os
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, _unavailable, find_stokerd

yaml = pytest.importorskip("yaml", reason="PyYAML reads the manifests (python/run-tests has it)")

DEPLOY = REPO / "deploy" / "kubernetes"
# What deploy/container/Dockerfile puts in the image.
IMAGE_BINARIES = ("/usr/bin/stokerd", "/usr/bin/stoker")


def manifests():
    """{file name: [documents]} of deploy/kubernetes."""
    out = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        out[path.name] = docs
    return out


def find(docs, kind, name):
    got = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(got) == 1, f"{kind}/{name}: {len(got)} found"
    return got[0]


def kubectl_steps():
    """The shell lines of docs/multi-host.md's Kubernetes block, continuation lines joined."""
    text = (REPO / "docs" / "multi-host.md").read_text()
    section = text.split("\n## Kubernetes\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_every_manifest_parses_with_a_kind_and_a_name():
    found = manifests()
    assert len(found) >= 7, sorted(found)
    for name, docs in found.items():
        assert docs, f"{name} holds no document"
        for d in docs:
            assert d.get("apiVersion") and d.get("kind"), f"{name}: {d}"
            assert d["metadata"].get("name"), f"{name}: a {d['kind']} without a name"


def test_the_documented_kubectl_steps_apply_files_that_exist_in_a_working_order():
    """The doc's `kubectl apply -f` files exist and parse; the namespace comes before what
    lives in it; the node label it sets is the one the DaemonSet and the Job select; the
    rollout it waits for is the DaemonSet it applied."""
    steps = kubectl_steps()
    applied, label = [], None
    for line in steps:
        words = line.split()
        assert words[0] == "kubectl", line
        if words[1] == "label":
            label = dict(w.split("=", 1) for w in words if "=" in w)
        for flag, value in zip(words, words[1:]):
            if flag == "-f":
                path = REPO / value
                assert path.is_file(), f"{line}: {value} does not exist"
                applied += [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert label == {"stoker.dev/node": "true"}, steps
    kinds = [d["kind"] for d in applied]
    assert kinds[0] == "Namespace", kinds
    namespace = applied[0]["metadata"]["name"]
    daemonset = find(applied, "DaemonSet", "stokerd")
    assert daemonset["metadata"]["namespace"] == namespace
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == label
    job = find(applied, "Job", "stoker-train")
    assert job["spec"]["template"]["spec"]["nodeSelector"] == label
    rollout = [s for s in steps if " rollout status " in s]
    assert rollout == [f"kubectl -n {namespace} rollout status daemonset/stokerd"], steps
    config = find(applied, "ConfigMap", "stoker-config")
    assert config["metadata"]["namespace"] == namespace


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pod:
    """One container of a manifest, run here: its paths moved under `root`, its ports to free
    ones on 127.0.0.1, /usr/bin/stokerd and /usr/bin/stoker the binaries under test."""

    def __init__(self, docs, workload, root):
        self.root = root
        self.spec = workload["spec"]["template"]["spec"]
        (self.container,) = [c for c in self.spec["containers"] if c["name"] == "stokerd"]
        self.ports = {p["name"]: p["containerPort"] for p in self.container.get("ports", [])}
        self.moved = {}
        exe = find_stokerd()
        if exe is None or not exe.is_file():
            _unavailable("stokerd is not built, or set STOKERD")
        self.binaries = {"/usr/bin/stokerd": str(exe),
                         "/usr/bin/stoker": str(exe.parent / "stoker")}
        self.volumes = {v["name"]: v for v in self.spec["volumes"]}
        self.mounts = {m["mountPath"]: self.volumes[m["name"]]
                       for m in self.container["volumeMounts"]}
        self.docs = docs

    def move(self, text):
        """`text` with the container's paths and listen addresses made local."""
        # One pass, longest path first, so that a moved path is not moved again.
        paths = "|".join(re.escape(p) for p in sorted(self.mounts, key=len, reverse=True))
        text = re.sub(rf"(?<![\w/.])({paths})(?=[/\"\s]|$)",
                      lambda m: str(self.root) + m.group(1), text)
        for port, local in self.moved.items():
            text = text.replace(f"0.0.0.0:{port}", f"127.0.0.1:{local}")
        return text

    def argv(self, command):
        command = [self.binaries.get(command[0], command[0]), *command[1:]]
        return [self.move(a) for a in command]

    def config_map_files(self):
        """Each ConfigMap volume's files, written where the container mounts them."""
        for path, volume in self.mounts.items():
            if "configMap" in volume:
                cm = find(self.docs, "ConfigMap", volume["configMap"]["name"])
                for key, text in cm["data"].items():
                    (self.root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
                    yield path, key, text

    def start(self):
        assert self.container["command"][0] in IMAGE_BINARIES, self.container["command"]
        for port in self.ports.values():
            self.moved[port] = free_port()
        for path in self.mounts:
            self.local(path).mkdir(parents=True, exist_ok=True)
        for path, key, text in self.config_map_files():
            (self.local(path) / key).write_text(self.move(text))
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
        for e in self.container.get("env", []):
            env[e["name"]] = self.move(e["value"])
        self.log = self.root / "stokerd.log"
        self.proc = subprocess.Popen(self.argv(self.container["command"]),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "wb"), env=env)

    def local(self, path):
        return Path(str(self.root) + path)

    def probe(self, name, timeout=60):
        """Runs the container's `name` probe until it passes (or `timeout` seconds)."""
        probe = self.container[name]
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            if "exec" in probe:
                r = subprocess.run(self.argv(probe["exec"]["command"]), capture_output=True,
                                   text=True, timeout=probe.get("timeoutSeconds", 5) + 30)
                passed, said = r.returncode == 0, r.stdout + r.stderr
            else:
                get = probe["httpGet"]
                port = get["port"]
                port = self.moved[self.ports[port] if isinstance(port, str) else port]
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{get['path']}",
                                                timeout=5) as answer:
                        passed, said = answer.status == 200, answer.read(200)
                except OSError as e:
                    passed, said = False, str(e)
            if passed:
                return said
            assert time.monotonic() < deadline, f"{name} never passed: {said}"
            time.sleep(0.1)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def run_pod(docs, workload, root, before=None):
    pod = Pod(docs, workload, root)
    try:
        if before:
            before(pod)
        pod.start()
        said = pod.probe("readinessProbe")
        pod.probe("livenessProbe")
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert int(annotations["prometheus.io/port"]) == pod.ports["metrics"]
        liveness = pod.container["livenessProbe"]["httpGet"]
        assert annotations["prometheus.io/path"] == liveness["path"]
        return pod, said
    finally:
        pod.stop()


def test_the_daemonset_container_runs_as_written_and_passes_its_probes(tmp_path):
    """The DaemonSet's command on the ConfigMap's stoker.toml (registered datasets made
    under the moved /data), its `stoker status` readiness probe and its /metrics liveness."""
    found = manifests()
    docs = found["configmap.yaml"] + found["daemonset.yaml"]
    daemonset = find(docs, "DaemonSet", "stokerd")

    def datasets(pod):
        toml = find(docs, "ConfigMap", "stoker-config")["data"]["stoker.toml"]
        for path in re.findall(r'^\S+ = "(/data/[^"]+)"$', toml, re.M):
            (pod.local(path) / "class0").mkdir(parents=True)
        assert "/run/stoker" in pod.mounts and "/data" in pod.mounts, sorted(pod.mounts)

    pod, said = run_pod(docs, daemonset, tmp_path, datasets)
    assert "imagenet-train" in said, said
    log = pod.log.read_text(errors="replace")
    assert "refus" not in log, log


def test_the_worker_runs_as_written_with_the_secret_made_as_its_comment_says(tmp_path):
    """workers.yaml's Deployment: the Secret made by the commands in its comment (run as
    written), mounted where the Secret volume goes with the volume's mode, is the file its
    stoker.toml reads; the worker starts, answers its probes and logs no refusal."""
    docs = manifests()["workers.yaml"]
    deployment = find(docs, "Deployment", "stoker-worker")
    text = (DEPLOY / "workers.yaml").read_text()
    commands = [line.lstrip("# ").strip() for line in text.splitlines()
                if line.startswith("#   ")]
    assert commands[0].endswith("> worker.secret") and "create secret generic" in commands[1]
    secret_name, key_file = re.search(r"generic (\S+) --from-file=(\S+)", commands[1]).groups()
    key, file = key_file.split("=")

    def secret(pod):
        (volume_path,) = [p for p, v in pod.mounts.items() if "secret" in v]
        volume = pod.mounts[volume_path]["secret"]
        assert volume["secretName"] == secret_name
        toml = find(docs, "ConfigMap", "stoker-worker-config")["data"]["stoker.toml"]
        assert f'secret_file = "{volume_path}/{key}"' in toml, toml
        subprocess.run(["bash", "-c", commands[0]], cwd=tmp_path, check=True)
        target = pod.local(volume_path) / key
        target.parent.mkdir(parents=True)
        target.write_bytes((tmp_path / file).read_bytes())
        target.chmod(volume["defaultMode"])
        (pod.root / "data").mkdir()

    pod, said = run_pod(docs, deployment, tmp_path / "pod", secret)
    assert pod.ports["units"] == int(re.search(r"0\.0\.0\.0:(\d+)",
                                               find(docs, "ConfigMap", "stoker-worker-config")
                                               ["data"]["stoker.toml"]).group(1))
    service = find(docs, "Service", "stoker-workers")
    assert service["spec"]["ports"][0]["targetPort"] in pod.ports
    log = pod.log.read_text(errors="replace")
    assert "refus" not in log, log


def test_the_training_job_reaches_the_daemonsets_socket():
    """train-job.yaml's pods mount the DaemonSet's socket folder and name the socket its
    ConfigMap binds, as a uid that config allows, and run the script their ConfigMap holds."""
    found = manifests()
    daemonset = find(found["daemonset.yaml"], "DaemonSet", "stokerd")["spec"]["template"]["spec"]
    toml = find(found["configmap.yaml"], "ConfigMap", "stoker-config")["data"]["stoker.toml"]
    docs = found["train-job.yaml"]
    job = find(docs, "Job", "stoker-train")["spec"]["template"]["spec"]
    (train,) = job["containers"]
    env = {e["name"]: e["value"] for e in train["env"]}
    bound = re.search(r'^socket = "(.+)"$', toml, re.M).group(1)
    assert env["STOKER_SOCKET"] == bound
    host = {v["name"]: v for v in daemonset["volumes"]}["socket-dir"]["hostPath"]["path"]
    volumes = {v["name"]: v for v in job["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in train["volumeMounts"]}
    assert mounts[os.path.dirname(bound)]["hostPath"]["path"] == host
    uids = re.search(r"^allowed_uids = \[(.*)\]$", toml, re.M).group(1)
    assert str(job["securityContext"]["runAsUser"]) in [u.strip() for u in uids.split(",")]
    script = train["command"][-1]
    folder, name = os.path.split(script)
    cm = find(docs, "ConfigMap", mounts[folder]["configMap"]["name"])
    assert name in cm["data"], sorted(cm["data"])
