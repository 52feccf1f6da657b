"""A real Kubernetes control plane on 127.0.0.1, started from the binaries ``scripts/control-plane.sh`` builds.

etcd, kube-apiserver (RBAC, service-account token issuer, the default admission plugins with Priority, APF),
kube-controller-manager (the controllers this project depends on, each with its own ServiceAccount credentials as
kubeadm runs them), kube-scheduler and kwok (fake nodes and pod lifecycle, no kubelet). Every process listens on a
free loopback port, logs to its own file under the work dir, and is stopped by its pid. Every wait is bounded and a
failed wait raises with the tail of the logs of the processes involved.

Authentication: static bearer tokens (``--token-auth-file``) for the admin (group ``system:masters``), the
controller-manager (``system:kube-controller-manager``) and the scheduler (``system:kube-scheduler``), so the
bootstrap RBAC roles of the real components apply. TLS: a throwaway CA and serving certificate made with openssl.

Audit: the apiserver writes an audit log (``logs/audit.log``, JSON lines, Metadata level, written before the response
is sent) of every request *except* those of the admin, the control-plane components and kube-system's
ServiceAccounts: what is left is what a test's own ServiceAccount tokens did (``audit_events``), so a test can tell
which credential made which write. ``stop_apiserver`` / ``start_apiserver`` restart kube-apiserver alone (same port,
same etcd, same certificates and keys) for the outage tests.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tests.prometheus.promserver import free_port as shared_free_port

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "control-plane.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
BIN_ENV = "GPU_AUTOSCALER_CONTROL_PLANE_BIN"

# The controllers of kube-controller-manager the tests depend on. node-lifecycle removes the not-ready taint that
# the TaintNodesByCondition admission plugin puts on every new node (kwok nodes included); serviceaccount makes the
# "default" ServiceAccount without which the ServiceAccount admission plugin rejects pods.
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
    "disruption-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "node-lifecycle-controller",
)

KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
COMPLETE_ANNOTATION = "realkube.gpuautoscaler.dev/complete"  # on a Job's pod template: kwok completes its pods
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
NODE_POOL_LABEL = "gpuautoscaler.dev/node-pool"

T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """A component did not start, died, or a bounded wait ran out; the message carries the relevant log tails."""


@dataclass(frozen=True)
class GpuNode:
    name: str
    gpus: int
    product: str
    pool: str
    cpu: str = "32"
    memory: str = "256Gi"
    pods: int = 110


DEFAULT_NODES = (
    GpuNode("kwok-a100-0", 8, "NVIDIA-A100-SXM4-80GB", "a100"),
    GpuNode("kwok-a100-1", 8, "NVIDIA-A100-SXM4-80GB", "a100"),
    GpuNode("kwok-l4-0", 4, "NVIDIA-L4", "l4"),
)


# ---- finding the binaries ----------------------------------------------------------------------------------------


def find_binaries() -> tuple[Path | None, str]:
    """(bin dir, "") when every binary is there, else (None, why not)."""
    explicit = os.environ.get(BIN_ENV)
    if explicit:
        bin_dir = Path(explicit)
    else:
        try:
            out = subprocess.run(
                ["bash", str(BUILD_SCRIPT), "--bin-dir"], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"{BUILD_SCRIPT.relative_to(REPO)} --bin-dir failed: {exc}"
        lines = out.stdout.strip().splitlines()
        if not lines:
            return None, f"{BUILD_SCRIPT.relative_to(REPO)} --bin-dir printed nothing: {out.stderr.strip()[-300:]}"
        bin_dir = Path(lines[-1])
    missing = [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
    if not (bin_dir / "kwok-stages").is_dir():
        missing.append("kwok-stages/")
    if missing:
        return None, (
            f"control-plane binaries not built ({', '.join(missing)} missing in {bin_dir}); "
            f"run scripts/control-plane.sh (cold build ~8 min on 2 cores) or set {BIN_ENV}"
        )
    return bin_dir, ""


def find_kubectl() -> tuple[Path | None, str]:
    """(kubectl, "") or (None, why not): ``$KUBECTL`` when set, else the pinned kubectl that
    ``scripts/control-plane.sh`` builds beside the control plane, else ``kubectl`` on PATH (Debian's 1.20 is too old
    for deploy/'s kustomizations, so the cache comes first)."""
    explicit = os.environ.get("KUBECTL")
    if explicit:
        if os.access(explicit, os.X_OK):
            return Path(explicit), ""
        return None, f"$KUBECTL={explicit} is not an executable"
    searched = []
    try:
        out = subprocess.run(
            ["bash", str(BUILD_SCRIPT), "--bin-dir"], capture_output=True, text=True, timeout=60, check=False
        )
        lines = out.stdout.strip().splitlines()
        if lines:
            built = Path(lines[-1]) / "kubectl"
            if os.access(built, os.X_OK):
                return built, ""
            searched.append(str(built))
    except (OSError, subprocess.TimeoutExpired) as exc:
        searched.append(f"{BUILD_SCRIPT.relative_to(REPO)} --bin-dir ({exc})")
    on_path = shutil.which("kubectl")
    if on_path:
        return Path(on_path), ""
    searched.append("PATH")
    return None, f"kubectl not found ({', '.join(searched)}): run scripts/control-plane.sh or set $KUBECTL"


# ---- small utilities ---------------------------------------------------------------------------------------------


def free_port() -> int:
    """A port for a component that binds it once started (see ``tests.prometheus.promserver.free_port``: below the
    kernel's ephemeral range, so no outgoing connection takes it meanwhile, and never handed out twice, so that
    kube-apiserver restarted on its port finds it free)."""
    return shared_free_port()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # PR_SET_PDEATHSIG: the component gets SIGKILL if pytest dies without tearing down (kill -9, OOM).
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text[-lines:])


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    interval_s: float = 0.1,
    on_timeout: Callable[[], str] | None = None,
    alive: Callable[[], str | None] | None = None,
) -> T:
    """Poll ``probe`` until it returns something other than None/False; raise ControlPlaneError at the deadline.

    ``alive`` returns a message when a process the wait depends on has died, which ends the wait at once.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        if alive is not None:
            dead = alive()
            if dead:
                raise ControlPlaneError(f"waiting for {what}: {dead}")
        try:
            result = probe()
            if result is not None and result is not False:
                return result
        except Exception as exc:  # a probe may fail until the thing is up
            last_error = exc
        if time.monotonic() >= deadline:
            extra = on_timeout() if on_timeout is not None else ""
            cause = f" (last error: {type(last_error).__name__}: {last_error})" if last_error else ""
            raise ControlPlaneError(f"timed out after {timeout_s:.0f}s waiting for {what}{cause}\n{extra}")
        time.sleep(interval_s)


class ApiError(Exception):
    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{method} {path}: HTTP {status}: {message}")
        self.status = status
        self.body = body
        self.reason = body.get("reason") if isinstance(body, dict) else None


# ---- processes ---------------------------------------------------------------------------------------------------


@dataclass
class Component:
    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    def start(self, env: dict[str, str]) -> None:
        log = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_die_with_parent,
            )
        finally:
            log.close()
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def dead(self) -> str | None:
        if self.process is None:
            return f"{self.name} was never started"
        code = self.process.poll()
        if code is None:
            return None
        return f"{self.name} (pid {self.process.pid}) exited with {code}; last lines of {self.log_path}:\n" + tail(
            self.log_path
        )

    def stop(self, grace_s: float = 10.0) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@dataclass
class ControlPlane:
    bin_dir: Path
    work_dir: Path
    nodes: tuple[GpuNode, ...] = DEFAULT_NODES
    components: dict[str, Component] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    verbosity: int = 1
    env: dict[str, str] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)  # components stopped on purpose (an apiserver outage)

    # -- layout --

    @property
    def pki(self) -> Path:
        return self.work_dir / "pki"

    @property
    def logs(self) -> Path:
        return self.work_dir / "logs"

    @property
    def ca_file(self) -> Path:
        return self.pki / "ca.crt"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.work_dir / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    # -- lifecycle --

    def start(self) -> ControlPlane:
        t0 = time.monotonic()
        for d in (self.pki, self.logs, self.work_dir / "etcd"):
            d.mkdir(parents=True, exist_ok=True)
        for name in ("etcd-client", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok"):
            self.ports[name] = free_port()
        self._make_pki()
        self._make_tokens()
        self._make_audit_policy()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_"))}
        env["HOME"] = str(self.work_dir)  # nothing reads or writes ~/.kube of the user running the tests
        self.env = env

        self._add("etcd", self._etcd_argv()).start(env)
        wait_for(
            "etcd /health",
            lambda: self._http_ok(f"http://127.0.0.1:{self.ports['etcd-client']}/health"),
            timeout_s=30,
            alive=self._alive("etcd"),
            on_timeout=lambda: self.log_tails(("etcd",)),
        )
        self.timings["etcd"] = time.monotonic() - t0

        self._add("kube-apiserver", self._apiserver_argv()).start(env)
        self._wait_apiserver_ready(timeout_s=120)
        self.timings["kube-apiserver"] = time.monotonic() - t0
        self._write_kubeconfig(self.admin_kubeconfig, "admin", self.tokens["admin"])
        self._write_kubeconfig(self.work_dir / "kcm.kubeconfig", "kube-controller-manager", self.tokens["kcm"])
        self._write_kubeconfig(self.work_dir / "scheduler.kubeconfig", "kube-scheduler", self.tokens["scheduler"])

        self._add("kube-controller-manager", self._kcm_argv()).start(env)
        self._add("kube-scheduler", self._scheduler_argv()).start(env)
        self._add("kwok", self._kwok_argv()).start(env)
        for name, port in (("kube-controller-manager", "controller-manager"), ("kube-scheduler", "scheduler")):
            url = f"https://127.0.0.1:{self.ports[port]}/healthz"  # self-signed serving cert: not verified
            wait_for(
                f"{name} /healthz",
                functools.partial(self._http_ok, url, verify=False),
                timeout_s=60,
                alive=self._alive(name, "kube-apiserver"),
                on_timeout=functools.partial(self.log_tails, (name,)),
            )
            self.timings[name] = time.monotonic() - t0
        wait_for(
            "kwok /healthz",
            lambda: self._http_ok(f"http://127.0.0.1:{self.ports['kwok']}/healthz"),
            timeout_s=60,
            alive=self._alive("kwok"),
            on_timeout=lambda: self.log_tails(("kwok",)),
        )
        self.timings["kwok"] = time.monotonic() - t0

        for node in self.nodes:
            self.request("POST", "/api/v1/nodes", self.node_manifest(node))
        self.wait_nodes_schedulable([n.name for n in self.nodes], timeout_s=60)
        self.timings["nodes"] = time.monotonic() - t0
        # The ServiceAccount controller is up once it has given the "default" namespace its ServiceAccount.
        self.wait_default_service_account("default", timeout_s=60)
        self.timings["ready"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        for name in reversed(list(self.components)):
            self.components[name].stop()

    def __enter__(self) -> ControlPlane:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_apiserver_ready(self, timeout_s: float) -> None:
        wait_for(
            "kube-apiserver /readyz",
            lambda: self._http_ok(self.server + "/readyz", token=self.tokens["admin"]),
            timeout_s=timeout_s,
            interval_s=0.1,
            alive=self._alive("etcd", "kube-apiserver"),
            on_timeout=lambda: self.log_tails(("etcd", "kube-apiserver")),
        )

    # -- an apiserver outage --

    def stop_apiserver(self, kill: bool = False) -> float:
        """Stop kube-apiserver alone (SIGTERM, or SIGKILL with ``kill``); etcd and the other components keep running
        and retry. Returns the seconds it took until the process was gone."""
        t0 = time.monotonic()
        component = self.components["kube-apiserver"]
        self.stopped.add(component.name)
        if kill and component.process is not None and component.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(component.process.pid, signal.SIGKILL)
            component.process.wait(timeout=10)
        component.stop()
        return time.monotonic() - t0

    def start_apiserver(self, timeout_s: float = 60) -> float:
        """Start kube-apiserver again with the same command line (same port, etcd, certificates, signing key and
        tokens: every credential issued before stays valid) and wait until /readyz answers 200 and the nodes are
        schedulable again. Returns the seconds until /readyz."""
        t0 = time.monotonic()
        component = self.components["kube-apiserver"]
        if component.process is not None and component.process.poll() is None:
            raise ControlPlaneError("start_apiserver: kube-apiserver is running (stop_apiserver first)")
        component.start(self.env)
        self.stopped.discard(component.name)
        self._wait_apiserver_ready(timeout_s=timeout_s)
        ready_s = time.monotonic() - t0
        self.wait_nodes_schedulable([n.name for n in self.nodes], timeout_s=timeout_s)
        self._wait_controllers_resynced(timeout_s=max(timeout_s, 90))
        return ready_s

    def _wait_controllers_resynced(self, timeout_s: float) -> None:
        """Wait until kube-controller-manager and kube-scheduler act again after an apiserver restart.

        A restarted apiserver answers /readyz while its authorizer still refuses the components' watches for a
        moment; each refused watch backs off (client-go's reflector doubles its wait up to 30 s), so a namespace
        made just then got no "default" ServiceAccount within the next test's 30 s (CI run of 2026-12-05). A probe
        namespace that gets its ServiceAccount, and a Deployment in it whose pod is made and bound, show the
        ServiceAccount, Deployment, ReplicaSet and scheduler loops watching again."""
        name = f"rk-restart-probe-{secrets.token_hex(3)}"
        self.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )
        try:
            self.wait_default_service_account(name, timeout_s=timeout_s)
            probe = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "probe"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "probe"}},
                    "template": {
                        "metadata": {"labels": {"app": "probe"}},
                        "spec": {
                            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                            "terminationGracePeriodSeconds": 0,
                        },
                    },
                },
            }
            self.request("POST", f"/apis/apps/v1/namespaces/{name}/deployments", probe)
            self.wait(
                "a probe pod made and bound after the apiserver restart",
                lambda: any(p.get("spec", {}).get("nodeName") for p in self.pods(name)) or None,
                timeout_s=timeout_s,
                interval_s=0.25,
            )
        finally:
            self.delete_namespace(name)

    def _add(self, name: str, argv: list[str]) -> Component:
        component = Component(name, argv, self.logs / f"{name}.log")
        self.components[name] = component
        return component

    def _alive(self, *names: str) -> Callable[[], str | None]:
        def check() -> str | None:
            for name in names:
                if name in self.stopped:
                    continue
                dead = self.components[name].dead()
                if dead:
                    return dead
            return None

        return check

    def log_tails(self, names: Iterable[str] | None = None, lines: int = 40) -> str:
        chosen = list(names) if names is not None else list(self.components)
        parts = []
        for name in chosen:
            comp = self.components.get(name)
            if comp is not None:
                parts.append(f"----- {name} (pid {comp.pid}) {comp.log_path} -----\n{tail(comp.log_path, lines)}")
        return "\n".join(parts)

    def pids(self) -> dict[str, int | None]:
        return {name: c.pid for name, c in self.components.items()}

    # -- credentials --

    def _openssl(self, *args: str) -> None:
        subprocess.run(["openssl", *args], cwd=self.pki, check=True, capture_output=True, timeout=60)

    def _make_pki(self) -> None:
        if shutil.which("openssl") is None:
            raise ControlPlaneError("openssl is not on PATH (needed for the throwaway CA and serving certificate)")
        self._openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key")
        self._openssl(
            "req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "2", "-subj", "/CN=realkube-ca",
            "-out", "ca.crt",
        )  # fmt: skip
        self._openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "apiserver.key")
        self._openssl("req", "-new", "-key", "apiserver.key", "-subj", "/CN=kube-apiserver", "-out", "apiserver.csr")
        (self.pki / "apiserver.ext").write_text(
            "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
            "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
            "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        )
        self._openssl(
            "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-sha256", "-extfile", "apiserver.ext", "-out", "apiserver.crt",
        )  # fmt: skip
        # The service-account token signing key (RS256, what every client library verifies).
        self._openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key")
        self._openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")

    def _make_tokens(self) -> None:
        self.tokens = {k: secrets.token_hex(16) for k in ("admin", "kcm", "scheduler")}
        rows = [
            f'{self.tokens["admin"]},admin,admin-uid,"system:masters"',
            f"{self.tokens['kcm']},system:kube-controller-manager,kcm-uid",
            f"{self.tokens['scheduler']},system:kube-scheduler,scheduler-uid",
        ]
        path = self.pki / "tokens.csv"
        path.write_text("\n".join(rows) + "\n")
        path.chmod(0o600)

    def _make_audit_policy(self) -> None:
        # Only what the tests' own identities do: the admin (the tests' set-up and kwok), the control-plane components
        # and kube-system's ServiceAccounts (kube-controller-manager's controllers) are left out, and so are the
        # discovery and health endpoints. RequestReceived is omitted: one event per request, at ResponseComplete.
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {
                    "level": "None",
                    "users": ["admin", "system:kube-controller-manager", "system:kube-scheduler", "system:apiserver"],
                },
                {"level": "None", "userGroups": ["system:serviceaccounts:kube-system", "system:nodes"]},
                {"level": "None", "nonResourceURLs": ["/*"]},
                {"level": "Metadata"},
            ],
        }
        (self.pki / "audit-policy.yaml").write_text(json.dumps(policy, indent=2))

    def audit_events(self, user_prefix: str = "") -> list[dict[str, Any]]:
        """The audit log's events (see the module's docstring for what it holds), in the order written; with
        ``user_prefix``, those whose ``user.username`` starts with it (e.g. ``system:serviceaccount:<ns>:``)."""
        try:
            lines = self.audit_log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:  # a line being written right now
                continue
            if str(event.get("user", {}).get("username", "")).startswith(user_prefix):
                out.append(event)
        return out

    def _write_kubeconfig(self, path: Path, user: str, token: str, namespace: str = "default") -> Path:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "realkube", "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)}}
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {"name": "realkube", "context": {"cluster": "realkube", "user": user, "namespace": namespace}}
            ],
            "current-context": "realkube",
        }
        path.write_text(json.dumps(doc, indent=2))  # JSON is YAML
        path.chmod(0o600)
        return path

    def write_kubeconfig(self, path: Path, user: str, token: str, namespace: str = "default") -> Path:
        """A kubeconfig for another identity (e.g. a ServiceAccount token from the TokenRequest API)."""
        return self._write_kubeconfig(path, user, token, namespace)

    # -- command lines --

    def _etcd_argv(self) -> list[str]:
        client_url = f"http://127.0.0.1:{self.ports['etcd-client']}"
        peer_url = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        return [
            str(self.bin_dir / "etcd"),
            "--name=realkube",
            f"--data-dir={self.work_dir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=realkube={peer_url}",
            "--unsafe-no-fsync",  # a test cluster: durability across power loss is not the point
            "--log-level=warn",
        ]

    def _apiserver_argv(self) -> list[str]:
        p = self.pki
        return [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd-client']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}",
            f"--cert-dir={self.work_dir / 'apiserver-certs'}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            f"--token-auth-file={p / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--anonymous-auth=false",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            # The default plugins stay on (NamespaceLifecycle, ServiceAccount, Priority, DefaultTolerationSeconds,
            # TaintNodesByCondition, PodSecurity, ResourceQuota, the admission webhooks and policies ...); Priority
            # is named only to say that it matters here.
            "--enable-admission-plugins=Priority",
            # 127.0.0.1 is no address for the "kubernetes" Service's endpoints; nothing here needs them.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            f"--audit-policy-file={p / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",  # the event is on disk before the client has its answer
            "--audit-log-maxbackup=1",
            "--audit-log-maxsize=200",
            f"--v={self.verbosity}",
        ]

    def _kcm_argv(self) -> list[str]:
        return [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={self.work_dir / 'kcm.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['controller-manager']}",
            f"--cert-dir={self.work_dir / 'kcm-certs'}",
            f"--controllers={','.join(CONTROLLERS)}",
            # Each controller acts as its own ServiceAccount (kube-system/<name>) under the bootstrap RBAC roles,
            # as kubeadm runs it: a missing permission of a real controller shows here too.
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.pki / 'sa.key'}",
            f"--root-ca-file={self.ca_file}",
            "--leader-elect=false",
            "--node-monitor-period=1s",
            f"--v={self.verbosity}",
        ]

    def _scheduler_argv(self) -> list[str]:
        return [
            str(self.bin_dir / "kube-scheduler"),
            f"--kubeconfig={self.work_dir / 'scheduler.kubeconfig'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports['scheduler']}",
            f"--cert-dir={self.work_dir / 'scheduler-certs'}",
            "--leader-elect=false",
            f"--v={self.verbosity}",
        ]

    def _kwok_config(self) -> Path:
        """kwok's Stages (run on its own it has none): the pinned module's fast node and pod stages, except that
        pods of Jobs complete only when annotated ``realkube.gpuautoscaler.dev/complete: "true"``, so that a
        training Job runs until the test suspends or completes it (kwok's own default completes them at once)."""
        docs = []
        for path in sorted((self.bin_dir / "kwok-stages").glob("*.yaml")):
            stage = yaml.safe_load(path.read_text())
            if stage["metadata"]["name"] == "pod-complete":
                stage["spec"]["selector"]["matchExpressions"].append(
                    {"key": f'.metadata.annotations["{COMPLETE_ANNOTATION}"]', "operator": "In", "values": ["true"]}
                )
            docs.append(stage)
        if not docs:
            raise ControlPlaneError(f"no kwok stages in {self.bin_dir / 'kwok-stages'}: rerun scripts/control-plane.sh")
        path = self.work_dir / "kwok.yaml"
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return path

    def _kwok_argv(self) -> list[str]:
        annotation = "=".join(KWOK_NODE_ANNOTATION)
        return [
            str(self.bin_dir / "kwok"),
            f"--config={self._kwok_config()}",
            f"--kubeconfig={self.admin_kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={annotation}",
            f"--server-address=127.0.0.1:{self.ports['kwok']}",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.240.0.1",
            # kwok renews its nodes' Leases: without them the node controller sees every node miss its heartbeat
            # (about every 50 s) and marks its pods Ready=False, and kwok never sets them back
            "--node-lease-duration-seconds=40",
        ]

    # -- REST (setup and assertions; the code under test uses its own adapters) --

    def _ssl(self, verify: bool = True) -> ssl.SSLContext:
        if not verify:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        return ssl.create_default_context(cafile=str(self.ca_file))

    def _http_ok(self, url: str, *, token: str | None = None, verify: bool = True) -> bool:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        context = self._ssl(verify) if url.startswith("https") else None
        try:
            with urllib.request.urlopen(req, timeout=5, context=context) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        timeout_s: float = 15.0,
    ) -> Any:
        """One JSON request to the apiserver as admin (or ``token``); ApiError on an error status."""
        url = self.server + path + ("?" + urllib.parse.urlencode(params) if params else "")
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {token or self.tokens['admin']}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=self._ssl()) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                parsed: Any = json.loads(raw)
            except ValueError:
                parsed = raw.decode(errors="replace")
            raise ApiError(method, path, exc.code, parsed) from None
        return json.loads(raw) if raw else {}

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # -- nodes and namespaces --

    @staticmethod
    def node_manifest(node: GpuNode) -> dict[str, Any]:
        resources = {"cpu": node.cpu, "memory": node.memory, "pods": str(node.pods), GPU_RESOURCE: str(node.gpus)}
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node.name,
                "annotations": {KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1], "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "kubernetes.io/hostname": node.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    GPU_PRODUCT_LABEL: node.product,
                    "nvidia.com/gpu.count": str(node.gpus),
                    NODE_POOL_LABEL: node.pool,
                },
            },
            # Nodes may carry their status on create; kwok keeps capacity/allocatable and sets the conditions.
            "status": {"capacity": resources, "allocatable": resources},
        }

    def wait_nodes_schedulable(self, names: list[str], timeout_s: float) -> None:
        def ready() -> bool:
            for name in names:
                node = self.get(f"/api/v1/nodes/{name}")
                conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions") or []}
                if conds.get("Ready") != "True":
                    return False
                if any(t.get("effect") == "NoSchedule" for t in node.get("spec", {}).get("taints") or []):
                    return False
            return True

        wait_for(
            f"nodes {', '.join(names)} Ready and untainted",
            ready,
            timeout_s=timeout_s,
            interval_s=0.25,
            alive=self._alive("kwok", "kube-controller-manager"),
            on_timeout=lambda: self.log_tails(("kwok", "kube-controller-manager")),
        )

    def wait_default_service_account(self, namespace: str, timeout_s: float = 60) -> None:
        wait_for(
            f"ServiceAccount {namespace}/default",
            lambda: self.exists(f"/api/v1/namespaces/{namespace}/serviceaccounts/default"),
            timeout_s=timeout_s,
            alive=self._alive("kube-controller-manager"),
            on_timeout=lambda: self.log_tails(("kube-controller-manager",)),
        )

    def create_namespace(self, name: str) -> None:
        self.request(
            "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )
        self.wait_default_service_account(name)

    def delete_namespace(self, name: str, wait_s: float = 0.0) -> None:
        with contextlib.suppress(ApiError):
            self.request("DELETE", f"/api/v1/namespaces/{name}")
        # Its pods go at once (a terminating namespace takes no new ones, so no controller recreates them): on a
        # loaded machine the namespace controller's own pass can take a minute, while the next test already
        # counts the shared kwok nodes' GPUs.
        with contextlib.suppress(ApiError):
            self.request("DELETE", f"/api/v1/namespaces/{name}/pods", params={"gracePeriodSeconds": "0"})
        if wait_s > 0:
            wait_for(
                f"namespace {name} deleted",
                lambda: not self.exists(f"/api/v1/namespaces/{name}"),
                timeout_s=wait_s,
                interval_s=0.25,
                on_timeout=lambda: self.log_tails(("kube-controller-manager",)),
            )

    def pods(self, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else None
        return list(self.get(f"/api/v1/namespaces/{namespace}/pods", params=params).get("items") or [])

    def wait(self, what: str, probe: Callable[[], T | None], timeout_s: float = 60, interval_s: float = 0.2) -> T:
        """``wait_for`` with the logs of the whole control plane on timeout and death of any component ending it."""
        return wait_for(
            what,
            probe,
            timeout_s=timeout_s,
            interval_s=interval_s,
            alive=self._alive(*self.components),
            on_timeout=lambda: self.log_tails(lines=25),
        )


@contextlib.contextmanager
def running_control_plane(bin_dir: Path, work_dir: Path, **kwargs: Any) -> Iterator[ControlPlane]:
    cp = ControlPlane(bin_dir=bin_dir, work_dir=work_dir, **kwargs)
    with cp:
        yield cp
