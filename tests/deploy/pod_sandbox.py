"""Pods run on this machine as the kubelet and a container runtime would run them, for the deploy
tests: each container a process tree in a bubblewrap sandbox, each pod in a network namespace of
its own (tests/deploy/pod_network.py), the images laid out by tests/deploy/image_layout.py.

What a container gets, as Kubernetes gives it:
- its command and args (the image's entrypoint where the manifest gives none), in its own PID
  namespace as PID 1; deletion runs its exec preStop hook inside the running container (its
  namespaces, root, user and env: what runc's exec gives), then SIGTERM to PID 1, the grace
  period (terminationGracePeriodSeconds, 30 s when unset), then SIGKILL; a lost pod (`kill`) or
  container (`kill_container`) gets SIGKILL;
- its environment: plain values with $(VAR) references, the downward API (metadata.name,
  metadata.namespace, metadata.labels['...'], status.podIP), secretKeyRef and configMapKeyRef
  (optional or not), envFrom; after the image's ENV;
- its securityContext: runAsUser/runAsGroup (else the image's USER), fsGroup as a supplementary
  group owning the pod's volumes (set-gid directories, as the kubelet's SetVolumeOwnership),
  readOnlyRootFilesystem (the image is read-only and only the volumes are writable),
  capabilities dropped, no_new_privs for allowPrivilegeEscalation: false;
- its volumes: emptyDir (a fresh directory per pod, kept across container restarts; medium
  Memory on this machine's /dev/shm), persistentVolumeClaim (a directory per claim that outlives
  every pod), secret and configMap (the keys and modes the manifest gives, group fsGroup);
- its pod IP, its hostname, and /etc/hosts with the Services' names (`name`, `name.ns`,
  `name.ns.svc`, `name.ns.svc.cluster.local`) for the pods they select, rewritten in place
  whenever pods come and go;
- its probes, run as the kubelet runs them (exec inside the container's view, httpGet and
  tcpSocket from the node to the pod IP), with the manifest's delays, periods, timeouts and
  thresholds: readiness is recorded, a failed liveness probe restarts the container;
- restartPolicy: Always/OnFailure restart an exited container after 10 s (the kubelet's first
  back-off); init containers run first, in order, each to success.

What it does not emulate: NetworkPolicies (every pod reaches every pod; tests/deploy/
test_networkpolicies.py evaluates them instead), resource requests and limits (cgroups), the
scheduler and nodes, image pulls, Service ClusterIPs and ports that differ from their target
ports (a name resolves to the pod IPs), readiness-gated endpoints (a Service's name resolves to
every running pod it selects), projected service-account tokens, postStart hooks and httpGet
preStop hooks, the container runtime's
open-files limit (containerd gives 1048576; here a container keeps this machine's hard limit, so
the `ulimit -n 65536` in KubeRay's command may say "Operation not permitted" and go on).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from image_layout import ImageLayout
from pod_network import PodNetwork

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the node reaches pods directly
RESTART_BACKOFF_S = 10  # the kubelet's first CrashLoopBackOff delay
DEFAULT_GRACE_S = 30  # terminationGracePeriodSeconds when a pod does not set it
MINIMUM_GRACE_S = 2  # the kubelet's minimumGracePeriodInSeconds after a preStop hook


@dataclass
class Container:
    """One container of a running pod: its process (None between restarts) and its probe state."""

    name: str
    spec: dict
    log: Path
    process: subprocess.Popen | None = None
    pid: int = 0  # the container's PID 1, as this machine numbers it
    restarts: int = 0
    ready: bool = False
    ever_ready: bool = False
    exit_codes: list[int] = field(default_factory=list)


@dataclass
class Pod:
    """A pod on the node: its manifest, address, namespace and containers."""

    name: str
    manifest: dict
    ip: str
    netns: str
    directory: Path
    containers: dict[str, Container] = field(default_factory=dict)
    deleting: bool = False

    @property
    def labels(self) -> dict[str, str]:
        return self.manifest["metadata"].get("labels", {})

    def running(self) -> bool:
        return any(c.process is not None and c.process.poll() is None for c in self.containers.values())


class Node:
    """One Kubernetes node and the API objects its pods read: Secrets, ConfigMaps, claims, Services."""

    def __init__(self, root: Path, images: dict[str, ImageLayout], namespace: str = "default") -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.images = images
        self.namespace = namespace
        self.network = PodNetwork()
        self.secrets: dict[str, dict[str, bytes]] = {}
        self.config_maps: dict[str, dict[str, str]] = {}
        self.services: dict[str, dict[str, str]] = {}  # name -> selector
        self.pods: dict[str, Pod] = {}
        self._lock = threading.Lock()
        self._started = 0
        self.memory_root = Path("/dev/shm") / f"slea-pods-{self.network.tag}"  # emptyDir medium: Memory

    # --- API objects -------------------------------------------------------------------------
    def claim(self, name: str) -> Path:
        """The directory behind a PersistentVolumeClaim: made on first use, kept until close."""
        path = self.root / "claims" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def add_service(self, name: str, selector: dict[str, str]) -> None:
        self.services[name] = selector
        self._write_hosts()

    def resolve(self, service: str) -> list[str]:
        """The pod IPs behind a Service name, as a pod's /etc/hosts has them."""
        selector = self.services[service]
        return [
            pod.ip
            for pod in self.pods.values()
            if not pod.deleting and all(pod.labels.get(k) == v for k, v in selector.items())
        ]

    # --- pods ----------------------------------------------------------------------------------
    def start(self, manifest: dict) -> Pod:
        """Run a Pod manifest: network, volumes, init containers in order, then its containers."""
        name = manifest["metadata"]["name"]
        assert name not in self.pods, f"pod {name} exists already"
        netns, ip = self.network.attach(name)
        self._started += 1
        directory = self.root / "pods" / f"{self._started:02d}-{name}"
        (directory / "logs").mkdir(parents=True)
        pod = Pod(name=name, manifest=manifest, ip=ip, netns=netns, directory=directory)
        with self._lock:
            self.pods[name] = pod
        self._write_hosts()
        spec = manifest["spec"]
        self._volumes(pod)
        for init in spec.get("initContainers", []):
            log = directory / "logs" / f"init-{init['name']}.log"
            argv = self._argv(pod, init)
            with open(log, "ab") as out:
                result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=600)
            assert result.returncode == 0, (
                f"pod {name}: init container {init['name']} exited {result.returncode}:\n{log.read_text()[-3000:]}"
            )
        for spec_container in spec["containers"]:
            container = Container(
                spec_container["name"], spec_container, directory / "logs" / f"{spec_container['name']}.log"
            )
            pod.containers[container.name] = container
            self._launch(pod, container)
            threading.Thread(target=self._supervise, args=(pod, container), daemon=True).start()
        return pod

    def kill(self, name: str) -> None:
        """The pod is lost at once (its node died, or it was OOM-killed whole): SIGKILL, no hook."""
        self._remove(name)

    def kill_container(self, pod: str, container: str) -> None:
        """SIGKILL one container's process tree; the kubelet restarts it per restartPolicy."""
        os.kill(self.pods[pod].containers[container].pid, signal.SIGKILL)

    def delete(self, name: str) -> dict[str, str]:
        """`kubectl delete pod`: the kubelet's killContainer for each container at once
        (kubernetes pkg/kubelet/kuberuntime/kuberuntime_container.go): the preStop hook within the
        grace period, then SIGTERM to PID 1 with what is left of it (2 s at least), then SIGKILL.
        Returns each container's hook output and how the container ended."""
        pod = self.pods[name]
        pod.deleting = True
        grace = pod.manifest["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        report: dict[str, str] = {}

        def kill_container(container: Container) -> None:
            started = time.monotonic()
            hook = container.spec.get("lifecycle", {}).get("preStop", {}).get("exec")
            lines = []
            if hook and container.process is not None and container.process.poll() is None:
                try:
                    result = subprocess.run(
                        self._exec_argv(pod, container, hook["command"]),
                        capture_output=True,
                        text=True,
                        timeout=grace,
                    )
                    lines.append(f"preStop exited {result.returncode}: {(result.stdout + result.stderr).strip()}")
                except subprocess.TimeoutExpired:
                    lines.append(f"preStop still running after the grace period ({grace} s)")
            left = max(MINIMUM_GRACE_S, grace - (time.monotonic() - started))
            if container.process is not None and container.process.poll() is None:
                os.kill(container.pid, signal.SIGTERM)
                try:
                    container.process.wait(timeout=left)
                    lines.append(f"exited {container.process.returncode} after SIGTERM")
                except subprocess.TimeoutExpired:
                    os.kill(container.pid, signal.SIGKILL)
                    container.process.wait(timeout=30)
                    lines.append(f"SIGKILLed {left:.0f} s after SIGTERM")
            report[container.name] = "; ".join(lines)

        threads = [threading.Thread(target=kill_container, args=(c,)) for c in pod.containers.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._remove(name)
        return report

    def wait_ready(self, name: str, timeout_s: float) -> Pod:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pod = self.pods.get(name)  # a pod whose init containers run has no containers yet
            if pod is not None and pod.containers and all(c.ready for c in pod.containers.values()):
                return pod
            time.sleep(1)
        raise TimeoutError(
            f"pod {name} not ready in {timeout_s:.0f} s; its logs:\n{self.tails(name) if name in self.pods else '(none)'}"
        )

    def wait_probe(self, name: str, path: str, port: int, timeout_s: float) -> None:
        """Until an HTTP GET of the pod's `path` on `port` answers 2xx/3xx (a raylet's agent up)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pod = self.pods.get(name)
            if pod is not None and pod.containers:
                container = next(iter(pod.containers.values()))
                if self._probe(pod, container, {"httpGet": {"path": path, "port": port}, "timeoutSeconds": 2}):
                    return
            time.sleep(1)
        raise TimeoutError(f"pod {name}: {path} on port {port} did not answer in {timeout_s:.0f} s")

    def tails(self, name: str, chars: int = 4000) -> str:
        pod = self.pods[name]
        return "\n".join(
            f"--- {c.name} ---\n{c.log.read_text(errors='replace')[-chars:]}" for c in pod.containers.values()
        )

    def close(self) -> None:
        for name in list(self.pods):
            self._remove(name)
        self.network.close()
        shutil.rmtree(self.memory_root, ignore_errors=True)

    # --- the kubelet's work --------------------------------------------------------------------
    def _remove(self, name: str) -> None:
        """The pod goes at once: SIGKILL to each container's PID 1."""
        pod = self.pods[name]
        pod.deleting = True
        for container in pod.containers.values():
            if container.process is not None and container.process.poll() is None:
                os.kill(container.pid, signal.SIGKILL)  # PID 1: its PID namespace goes with it
        for container in pod.containers.values():
            if container.process is not None:
                container.process.wait(timeout=30)
        with self._lock:
            del self.pods[name]
        self.network.detach(name)
        self._write_hosts()

    def _supervise(self, pod: Pod, container: Container) -> None:
        """Restarts per restartPolicy, and the probes, until the pod is deleted."""
        policy = pod.manifest["spec"].get("restartPolicy", "Always")
        threading.Thread(target=self._probe_loop, args=(pod, container), daemon=True).start()
        while not pod.deleting:
            assert container.process is not None
            code = container.process.wait()
            container.exit_codes.append(code)
            container.ready = False
            if pod.deleting or policy == "Never" or (policy == "OnFailure" and code == 0):
                return
            time.sleep(RESTART_BACKOFF_S)
            if pod.deleting:
                return
            container.restarts += 1
            self._launch(pod, container)

    def _probe_loop(self, pod: Pod, container: Container) -> None:
        readiness, liveness = container.spec.get("readinessProbe"), container.spec.get("livenessProbe")
        if readiness is None:
            container.ready = container.ever_ready = True
        started, restarts = time.monotonic(), container.restarts
        streaks = {"readiness": [0, 0], "liveness": [0, 0]}  # successes, failures in a row
        while not pod.deleting:
            if container.restarts != restarts:  # a new run of the container: delays count again
                started, restarts = time.monotonic(), container.restarts
                streaks = {"readiness": [0, 0], "liveness": [0, 0]}
            for kind, probe in (("readiness", readiness), ("liveness", liveness)):
                if probe is None or time.monotonic() - started < probe.get("initialDelaySeconds", 0):
                    continue
                ok = self._probe(pod, container, probe)
                streak = streaks[kind]
                streak[:] = [streak[0] + 1, 0] if ok else [0, streak[1] + 1]
                if kind == "readiness":
                    if streak[0] >= probe.get("successThreshold", 1):
                        container.ready = container.ever_ready = True
                    elif streak[1] >= probe.get("failureThreshold", 3):
                        container.ready = False
                elif streak[1] >= probe.get("failureThreshold", 3) and container.pid and not pod.deleting:
                    os.kill(container.pid, signal.SIGKILL)  # the kubelet kills; _supervise restarts
                    streak[1] = 0
            periods = [p.get("periodSeconds", 10) for p in (readiness, liveness) if p]
            time.sleep(min(periods) if periods else 5)

    def _probe(self, pod: Pod, container: Container, probe: dict) -> bool:
        timeout = probe.get("timeoutSeconds", 1)
        try:
            if "exec" in probe:
                argv = self._argv(pod, container.spec, command=probe["exec"]["command"])
                return subprocess.run(argv, capture_output=True, timeout=timeout + 5).returncode == 0
            action = probe.get("httpGet") or probe["tcpSocket"]
            port = self._port(container.spec, action["port"])
            if "httpGet" in probe:
                url = f"http://{pod.ip}:{port}{action.get('path', '/')}"
                with NO_PROXY.open(url, timeout=timeout) as response:
                    return 200 <= response.status < 400
            with socket.create_connection((pod.ip, port), timeout=timeout):
                return True
        except (OSError, subprocess.TimeoutExpired):
            return False

    @staticmethod
    def _port(container: dict, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        return next(p["containerPort"] for p in container.get("ports", []) if p.get("name") == port)

    def _launch(self, pod: Pod, container: Container) -> None:
        info_read, info_write = os.pipe()
        with open(container.log, "ab") as out:
            container.process = subprocess.Popen(
                self._argv(pod, container.spec, info_fd=info_write),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                pass_fds=(info_write,),
            )
        os.close(info_write)
        with os.fdopen(info_read) as info:
            container.pid = json.loads(info.read() or "{}").get("child-pid", 0)
        assert container.pid, (
            f"pod {pod.name} container {container.name} did not start:\n{container.log.read_text()[-2000:]}"
        )

    # --- what a container sees -----------------------------------------------------------------
    def _argv(self, pod: Pod, spec: dict, command: list[str] | None = None, info_fd: int | None = None) -> list[str]:
        """`ip netns exec` + bwrap (mounts, made as root) + setpriv (the pod's user) + the command."""
        image = self._image(spec)
        security = _security(pod, spec)
        image_mounts, read_only_later, over_volumes = image.mounts(
            [mount["mountPath"] for mount in spec.get("volumeMounts", [])]
        )
        mounts = ["--tmpfs", "/", *image_mounts, "--dev", "/dev", "--proc", "/proc"]
        for mount in spec.get("volumeMounts", []):
            source = pod.directory / "volumes" / mount["name"]
            if (pod.directory / "volumes" / f"{mount['name']}.memory").exists():
                source = Path((pod.directory / "volumes" / f"{mount['name']}.memory").read_text())
            flag = "--ro-bind" if mount.get("readOnly") else "--bind"
            mounts += [flag, str(source / mount.get("subPath", "")), mount["mountPath"]]
        mounts += over_volumes
        for name, source in (
            ("hosts", pod.directory / "hosts"),
            ("hostname", pod.directory / "hostname"),
            ("resolv.conf", self.root / "resolv.conf"),
        ):
            mounts += ["--ro-bind", str(source), f"/etc/{name}"]
        if security.get("readOnlyRootFilesystem"):
            for directory in [*read_only_later, "/"]:
                mounts += ["--remount-ro", directory]
        env = self._environment(pod, spec)
        sandbox = [
            "ip",
            "netns",
            "exec",
            pod.netns,
            "bwrap",
            *mounts,
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname",
            pod.name,
            "--die-with-parent",
            "--as-pid-1",
            "--chdir",
            spec.get("workingDir", image.workdir),
            "--clearenv",
        ]
        for key, value in env.items():
            sandbox += ["--setenv", key, value]
        if info_fd is not None:
            sandbox += ["--info-fd", str(info_fd)]
        return [*sandbox, "--", *self._user(pod, spec), *(command or image.command(spec, env))]

    def _exec_argv(self, pod: Pod, container: Container, command: list[str]) -> list[str]:
        """A command in the running container, as the runtime's exec (hooks, `kubectl exec`) runs it:
        in its namespaces (it sees the container's processes), its root, its user and its env."""
        env = self._environment(pod, container.spec)
        # --root and --wd without a path: PID 1's root and working directory (a path given here
        # would be opened on this machine, before nsenter enters the container's mounts)
        enter = ["nsenter", f"--target={container.pid}", "--mount", "--uts", "--ipc", "--net", "--pid"]
        return [
            *enter,
            "--root",
            "--wd",
            *self._user(pod, container.spec),
            "env",
            "-i",
            *(f"{k}={v}" for k, v in env.items()),
            *command,
        ]

    def _user(self, pod: Pod, spec: dict) -> list[str]:
        """setpriv to the container's user, groups, capabilities and no_new_privs."""
        image = self._image(spec)
        security = _security(pod, spec)
        uid = security.get("runAsUser", image.uid)
        gid = security.get("runAsGroup", image.gid)
        groups = sorted({gid, *([security["fsGroup"]] if "fsGroup" in security else [])})
        drop = (
            ["--bounding-set=-all", "--inh-caps=-all"]
            if "ALL" in security.get("capabilities", {}).get("drop", [])
            else []
        )
        no_new_privs = ["--no-new-privs"] if security.get("allowPrivilegeEscalation") is False else []
        return [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={gid}",
            f"--groups={','.join(map(str, groups))}",
            *drop,
            *no_new_privs,
            "--",
        ]

    def _image(self, spec: dict) -> ImageLayout:
        return self.images[re.split(r"[@:]", spec["image"])[0]]

    def _environment(self, pod: Pod, spec: dict) -> dict[str, str]:
        """What the container's processes see: the image's ENV, then the manifest's."""
        return {**self._image(spec).env, **self._env(pod, spec)}

    def _env(self, pod: Pod, spec: dict) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in spec.get("envFrom", []):
            prefix = source.get("prefix", "")
            if ref := source.get("configMapRef"):
                env.update({prefix + k: v for k, v in self._object(self.config_maps, ref, "ConfigMap").items()})
            if ref := source.get("secretRef"):
                env.update({prefix + k: v.decode() for k, v in self._object(self.secrets, ref, "Secret").items()})
        for variable in spec.get("env", []):
            if "value" in variable:
                env[variable["name"]] = re.sub(
                    r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), variable["value"]
                )
            elif field_ref := variable["valueFrom"].get("fieldRef"):
                env[variable["name"]] = self._field(pod, field_ref["fieldPath"])
            elif ref := variable["valueFrom"].get("secretKeyRef"):
                if (value := self._key(self.secrets, ref, "Secret")) is not None:
                    env[variable["name"]] = value.decode()
            elif ref := variable["valueFrom"].get("configMapKeyRef"):
                if (value := self._key(self.config_maps, ref, "ConfigMap")) is not None:
                    env[variable["name"]] = value
            else:
                raise AssertionError(f"pod {pod.name}: env {variable['name']}: a source the runner does not model")
        return env

    def _field(self, pod: Pod, path: str) -> str:
        fields = {"metadata.name": pod.name, "metadata.namespace": self.namespace, "status.podIP": pod.ip}
        if label := re.fullmatch(r"metadata\.labels\['([^']+)'\]", path):
            return pod.labels.get(label.group(1), "")
        assert path in fields, f"pod {pod.name}: a fieldRef the runner does not model: {path}"
        return fields[path]

    @staticmethod
    def _object(store: dict, ref: dict, kind: str) -> dict:
        if ref["name"] not in store:
            if ref.get("optional"):
                return {}
            raise AssertionError(
                f"{kind} {ref['name']} does not exist: the pod would not start (CreateContainerConfigError)"
            )
        return store[ref["name"]]

    def _key(self, store: dict, ref: dict, kind: str):
        data = self._object(store, ref, kind)
        if ref["key"] not in data and not ref.get("optional"):
            raise AssertionError(f"{kind} {ref['name']} has no key {ref['key']!r}: the pod would not start")
        return data.get(ref["key"])

    def _volumes(self, pod: Pod) -> None:
        spec = pod.manifest["spec"]
        fs_group = spec.get("securityContext", {}).get("fsGroup")
        root = pod.directory / "volumes"
        root.mkdir()
        for volume in spec.get("volumes", []):
            path = root / volume["name"]
            if "emptyDir" in volume:
                if volume["emptyDir"].get("medium") == "Memory":
                    backing = self.memory_root / pod.directory.name / volume["name"]
                    backing.mkdir(parents=True)
                    (root / f"{volume['name']}.memory").write_text(str(backing))
                    path = backing
                else:
                    path.mkdir()
                _own(path, fs_group, mode=0o777 if fs_group is None else 0o2775)
            elif claim := volume.get("persistentVolumeClaim"):
                path.symlink_to(self.claim(claim["claimName"]))
                if fs_group is not None:
                    for directory in [path.resolve(), *(p for p in path.resolve().rglob("*") if p.is_dir())]:
                        _own(directory, fs_group, mode=0o2775)
            elif "secret" in volume or "configMap" in volume:
                kind = "secret" if "secret" in volume else "configMap"
                source = volume[kind]
                store = self.secrets if kind == "secret" else self.config_maps
                data = self._object(
                    store,
                    {"name": source.get("secretName", source.get("name")), "optional": source.get("optional")},
                    kind,
                )
                items = source.get("items") or [{"key": key, "path": key} for key in data]
                path.mkdir()
                for item in items:
                    content = data[item["key"]]
                    target = path / item["path"]
                    target.write_bytes(content if isinstance(content, bytes) else content.encode())
                    _own(target, fs_group, mode=item.get("mode", source.get("defaultMode", 0o644)))
                os.chmod(path, 0o755)
            else:
                raise AssertionError(f"pod {pod.name}: volume {volume['name']}: a kind the runner does not model")

    def _write_hosts(self) -> None:
        """Every pod's /etc/hosts, written in place (a bind mount keeps the file's inode)."""
        with self._lock:
            (self.root / "resolv.conf").write_text(
                f"search {self.namespace}.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
            )
            services = []
            for service in self.services:
                names = f"{service} {service}.{self.namespace} {service}.{self.namespace}.svc {service}.{self.namespace}.svc.cluster.local"
                services += [f"{ip} {names}" for ip in self.resolve(service)]
            for pod in self.pods.values():
                (pod.directory / "hostname").write_text(pod.name + "\n")
                lines = ["127.0.0.1 localhost", f"{pod.ip} {pod.name}", *services]
                with open(pod.directory / "hosts", "a+") as hosts:
                    hosts.seek(0)
                    hosts.truncate()
                    hosts.write("\n".join(lines) + "\n")


def _security(pod: Pod, spec: dict) -> dict:
    """The container's securityContext over the pod's."""
    return {**pod.manifest["spec"].get("securityContext", {}), **spec.get("securityContext", {})}


def _own(path: Path, group: int | None, mode: int) -> None:
    if group is not None:
        os.chown(path, 0, group)
    os.chmod(path, mode)
