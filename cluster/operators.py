"""The operators the test control plane runs beside Kubernetes itself: the Kubeflow training
operator (always, unless ``Cluster(training_operator=False)``), and on demand JobSet, Kubeflow
Trainer v2 and Kueue, each from its own upstream manifests with its webhooks served with
certificates from the cluster's CA.

:class:`Operators` is a part of :class:`cluster.control_plane.Cluster` (its base class):
the methods use the cluster's tools (``kubectl``, ``apply``, ``_spawn``, ``_wait``) and state.
Kept apart so that the core control plane (etcd, the API server, controllers, kwok) reads on
its own.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509

from cluster import build
from cluster.pki import CertificateAuthority, dns_names, private_dir, write_private

ROOT = Path(__file__).resolve().parent.parent

#: Where the training operator lives and how its webhook is named (its v1.9 main.go).
OPERATOR_NAMESPACE = "kubeflow"
OPERATOR_SECRET = "training-operator-webhook-cert"
OPERATOR_WEBHOOK_CONFIG = "validator.training-operator.kubeflow.org"
#: The CA names the operators' certificate rotators verify a given CA against (their CAName).
#: JobSet's, Trainer v2's and Kueue's are the caName constants of their pkg/util/cert/cert.go.
WEBHOOK_CA_NAMES = (
    "megdet-webhook-ca",
    "training-operator-ca",
    "jobset-ca",
    "kubeflow-trainer-ca",
    "kueue-ca",
)
#: The in-cluster names the rotators verify the serving certificate against (<svc>.<ns>.svc);
#: JobSet's, Trainer's and Kueue's from their default Service names and namespaces (below).
WEBHOOK_SERVICE_NAMES = (
    f"training-operator.{OPERATOR_NAMESPACE}.svc",
    "jobset-webhook-service.jobset-system.svc",
    "kubeflow-trainer-controller-manager.kubeflow-system.svc",
    "kueue-webhook-service.kueue-system.svc",
)
#: The restricted-profile init container template the operator chart ships for platforms.
PYTORCH_INIT_CONTAINER = (
    ROOT / "charts/megdet-operator/files/pytorch-init-container-restricted.yaml"
)
#: Where the training operator's, JobSet's and Trainer's certificate rotators look for the
#: serving certificate, and where their webhook servers read it (controller-runtime's default,
#: os.TempDir()/k8s-webhook-server/serving-certs): a constant in each one's cert package with no
#: flag (training-operator v1.9.4 pkg/cert/cert.go, jobset v0.12.0 pkg/util/cert/cert.go,
#: trainer v2.3.0 pkg/util/cert/cert.go). In a pod it is the Secret's volume mount; here each
#: runs in a mount namespace of its own (private_mounts) whose /tmp is a private tmpfs with the
#: cluster's ``webhook-certs`` folder bound at this path: nothing is written to the host's
#: /tmp. Kueue takes the folder from its configuration (webhook.certDir).
UPSTREAM_CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"
#: private_mounts' script: $1 is a count N, then N entries of the host's /tmp that the command
#: names (its state folder, binary, files: bound back, read through the descriptor of the
#: /tmp the tmpfs covers), then the certificate folder.
PRIVATE_TMP_STEP = (
    "exec 3</tmp && mount -t tmpfs -o mode=0700,size=16m megdet-tmp /tmp"
    ' && n=$1 && shift && while [ "$n" -gt 0 ]; do'
    ' if [ -d "/proc/self/fd/3/$1" ]; then mkdir -p "/tmp/$1"; else : > "/tmp/$1"; fi'
    ' && mount -c --bind "/proc/self/fd/3/$1" "/tmp/$1" || exit 1; shift; n=$((n - 1)); done'
    f' && exec 3<&- && mkdir -p {UPSTREAM_CERT_DIR} && mount --bind "$1" {UPSTREAM_CERT_DIR}'
    " && shift && export TMPDIR=/tmp"
)
#: Kubeflow Trainer v2, JobSet and Kueue (Cluster(trainer_v2=True, kueue=True)). Each one's
#: certificate rotator reads a Secret in a namespace and checks certificates against names that
#: the operator hard-codes or defaults; webhook_pki() issues certificates that pass, and
#: webhook_secret() hands them over. Out of a pod (no ServiceAccount namespace file) JobSet and
#: Trainer fall back to these namespaces: jobset v0.12.0 pkg/util/cert/cert.go
#: (defaultNamespace, caName "jobset-ca", the two configuration names) and
#: api/config/v1alpha1/defaults.go (the Secret and Service names); trainer v2.3.0
#: pkg/util/cert/cert.go (defaultNamespace, caName "kubeflow-trainer-ca"),
#: cmd/trainer-controller-manager/main.go (the configuration names) and
#: pkg/apis/config/v1alpha1/defaults.go; kueue v0.19.0 pkg/util/cert/cert.go (caName
#: "kueue-ca", the names derived from the Service name) and apis/config/v1beta2/defaults.go.
JOBSET_NAMESPACE = "jobset-system"
JOBSET_SECRET = "jobset-webhook-server-cert"
JOBSET_WEBHOOK_CONFIGS = {
    "ValidatingWebhookConfiguration": "jobset-validating-webhook-configuration",
    "MutatingWebhookConfiguration": "jobset-mutating-webhook-configuration",
}
TRAINER_NAMESPACE = "kubeflow-system"
TRAINER_SECRET = "kubeflow-trainer-webhook-cert"
TRAINER_WEBHOOK_CONFIGS = {
    "ValidatingWebhookConfiguration": "validator.trainer.kubeflow.org",
    "MutatingWebhookConfiguration": "defaulter.trainer.kubeflow.org",
}
#: The operators whose kustomization patches upstream's webhooks (manifests.yaml): the folder
#: of both in the module, and the JSON patches for the mutating and the validating kind.
#: JobSet's give the pod hooks an objectSelector (pods of a JobSet only).
PATCHED_WEBHOOKS = {
    "jobset": (
        "config/components/webhook",
        "patches/mutating-patch.yaml",
        "patches/validating-patch.yaml",
    ),
    "trainer": ("manifests/base/webhook", "patch_mutating.yaml", "patch_validating.yaml"),
}
KUEUE_NAMESPACE = "kueue-system"
KUEUE_SECRET = "kueue-webhook-server-cert"
KUEUE_WEBHOOK_CONFIGS = {
    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration",
    "MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
}
#: The Kueue integrations the cluster turns on: the project's two targets, trainjob and
#: pytorchjob (kueue v0.19.0 pkg/controller/jobs/trainjob/trainjob_controller.go and
#: pkg/controller/jobs/kubeflow/jobs/pytorchjob/pytorchjob_controller.go, FrameworkName).
KUEUE_FRAMEWORKS = ("trainer.kubeflow.org/trainjob", "kubeflow.org/pytorchjob")
#: The job kinds of those integrations, by API group: Kueue's webhooks for them are served,
#: those of its other kinds (the training operator's TFJob, JAXJob, ... among them) are not.
KUEUE_JOB_RESOURCES = {"trainer.kubeflow.org": {"trainjobs"}, "kubeflow.org": {"pytorchjobs"}}


def kueue_hook_kept(hook: Mapping[str, Any]) -> bool:
    """Whether the cluster serves Kueue's webhook ``hook``: those of Kueue's own kinds and of
    the job kinds in KUEUE_JOB_RESOURCES."""
    for rule in hook["rules"]:
        for group in rule["apiGroups"]:
            if group == "kueue.x-k8s.io":
                return True
            if set(rule["resources"]) & KUEUE_JOB_RESOURCES.get(group, set()):
                return True
    return False


#: A pod's ServiceAccount namespace file: JobSet and Trainer use it over their defaults.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: Trainer v2.3.0's alpha feature gate for its status server and the TrainJobStatus plugin
#: (pkg/features/features.go; off by default), and the ServiceAccount whose token its manager
#: reads its issuer from (pkg/statusserver/auth.go, getClusterOIDCIssuerURL).
TRAINER_STATUS_GATE = "TrainJobStatus"
TRAINER_SERVICE_ACCOUNT = "kubeflow-trainer-controller-manager"
#: Run in its own mount namespace, Trainer's manager sees the folder given as $1 where a pod
#: has its ServiceAccount files (a tmpfs over /run, which /var/run points to, holds the mount
#: point); nothing on the host changes.
POD_FILES_STEP = (
    'run=$(readlink -f /var/run) && mount -t tmpfs -o mode=0755,size=1m megdet-pod-run "$run"'
    ' && mkdir -p "$run/secrets/kubernetes.io/serviceaccount"'
    ' && mount --bind "$1" "$run/secrets/kubernetes.io/serviceaccount" && shift'
)


def _under_tmp(named: Sequence[str]) -> list[str]:
    """The entries of the host's /tmp that the paths in ``named`` (arguments: a path, or
    ``--flag=path``) lie in, by name: what a private /tmp must bind back (PRIVATE_TMP_STEP)."""
    tmp = Path("/tmp").resolve()
    keep: set[str] = set()
    for arg in named:
        value = arg.split("=", 1)[-1]
        if not value.startswith("/"):
            continue
        path = Path(value).resolve()
        if path.is_relative_to(tmp) and path != tmp:
            keep.add(path.relative_to(tmp).parts[0])
    return sorted(keep)


class Operators:
    """The operators' part of a Cluster (see the module doc)."""

    # --- the Kubeflow training operator -------------------------------------------------------
    def module_dir(self, pin: str) -> Path:
        """An upstream module's source in Go's module cache (manifests, CRDs, stages)."""
        return build.module_source(pin)

    def wait_established(self, crd: str, timeout: float = 60) -> None:
        """Until the API server serves ``crd`` (its Established condition is True)."""

        def established() -> bool:
            out = self.kubectl("get", "crd", crd, "-o", "json", check=False, timeout=10)
            conditions = json.loads(out.stdout or "{}").get("status", {}).get("conditions", [])
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        self._wait(f"CRD {crd}", established, timeout, log="kube-apiserver")

    @staticmethod
    def webhook_pki() -> Path:
        """The operators' webhook CA and serving certificate: one per machine, in the build
        cache (a folder only its owner opens), so that caBundles stay the same across the
        machine's clusters."""
        import fcntl

        folder = build.cache_dir() / "webhook-pki"
        folder.mkdir(parents=True, exist_ok=True)
        dns = ["localhost", *WEBHOOK_SERVICE_NAMES]
        # Clusters on the machine may start at the same time: one issues, the others wait.
        with open(folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            ca = CertificateAuthority(folder, names=WEBHOOK_CA_NAMES)
            # A cache from before an operator was added lacks its CAName: re-sign the CA with
            # the same key (so caBundles of clusters already running stay valid) ...
            renewed = ca.add_names(WEBHOOK_CA_NAMES)
            crt = folder / "webhook.crt"
            if (
                renewed
                or not crt.exists()
                or not set(dns) <= set(dns_names(x509.load_pem_x509_certificate(crt.read_bytes())))
            ):
                # ... and issue a serving certificate valid for 127.0.0.1 (the webhook
                # configurations use url: https://127.0.0.1:PORT) and for the Service names
                # each operator's rotator checks the certificate against.
                ca.issue("webhook", "megdet-webhooks", server=True, ips=["127.0.0.1"], dns=dns)
        return folder

    @property
    def webhook_cert_dir(self) -> Path:
        """This cluster's copy of what an operator's Deployment gets from its Secret volume
        (tls.crt, tls.key, ca.crt), in its state folder; see UPSTREAM_CERT_DIR."""
        return self.root / "webhook-certs"

    def mount_webhook_certs(self) -> Path:
        """Write the webhook serving certificate into webhook_cert_dir (0700, the key 0600;
        cert-controller only checks that tls.crt exists); returns the folder."""
        pki = self.webhook_pki()
        folder = private_dir(self.webhook_cert_dir)
        for name, source in (
            ("tls.crt", "webhook.crt"),
            ("tls.key", "webhook.key"),
            ("ca.crt", "ca.crt"),
        ):
            data = (pki / source).read_bytes()
            target = folder / name
            if not target.exists() or target.read_bytes() != data:
                write_private(target, data)
        return folder

    def private_mounts(self, command: Sequence[str], pod_files: Path | None = None) -> list[str]:
        """``command`` run in a mount namespace of its own, with a private /tmp holding
        webhook_cert_dir at UPSTREAM_CERT_DIR (and what of the host's /tmp the command names:
        PRIVATE_TMP_STEP) and, with ``pod_files``, that folder where a pod has its
        ServiceAccount files (POD_FILES_STEP)."""
        named = [str(self.root), str(self.webhook_cert_dir), *command]
        if pod_files is not None:
            named.append(str(pod_files))
        keep = _under_tmp(named)
        steps = [PRIVATE_TMP_STEP]
        args = [str(len(keep)), *keep, str(self.webhook_cert_dir)]
        if pod_files is not None:
            steps.append(POD_FILES_STEP)
            args.append(str(pod_files))
        script = " && ".join([*steps, 'exec "$@"'])
        # Root may make a mount namespace; anyone else needs a user namespace for it.
        user = [] if os.geteuid() == 0 else ["--map-root-user"]
        return ["unshare", "--mount", *user, "--", "sh", "-c", script, "sh", *args, *command]

    def webhook_secret(self, namespace: str, name: str) -> dict[str, Any]:
        """A cert-controller style Secret holding the project's webhook certificate and CA, so
        the operator's certificate rotator finds a valid one and serves it instead of its own."""

        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        pki = self.webhook_pki()
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace},
            "data": {
                "ca.crt": b64(pki / "ca.crt"),
                "ca.key": b64(pki / "ca.key"),
                "tls.crt": b64(pki / "webhook.crt"),
                "tls.key": b64(pki / "webhook.key"),
            },
        }

    def webhook_configuration(self, name: str, port: int, source: Path) -> dict[str, Any]:
        """The upstream ValidatingWebhookConfiguration, pointed at the operator on this host."""
        upstream = yaml.safe_load(source.read_text())
        ca = base64.b64encode((self.webhook_pki() / "ca.crt").read_bytes()).decode()
        for hook in upstream["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
        upstream["metadata"] = {"name": name}
        return upstream

    def _start_training_operator(self, state: dict[str, Any], timeout: float) -> None:
        from cluster.node import busybox_image

        ports = state["ports"]
        module = self.module_dir("training_operator")
        crd = module / "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
        self.kubectl("create", "namespace", OPERATOR_NAMESPACE)
        self.apply(crd.read_text(), server_side=True)
        self.wait_established("pytorchjobs.kubeflow.org")
        hooks = self.webhook_configuration(
            OPERATOR_WEBHOOK_CONFIG,
            ports["training-operator-webhook"],
            module / "manifests/base/webhook/manifests.yaml",
        )
        # Only PyTorchJob is served (--enable-scheme=pytorchjob); the other kinds' hooks would
        # point at paths nobody serves.
        hooks["webhooks"] = [h for h in hooks["webhooks"] if "pytorchjob" in h["name"]]
        self.apply([self.webhook_secret(OPERATOR_NAMESPACE, OPERATOR_SECRET), hooks])
        self.mount_webhook_certs()
        proc = self._spawn(
            state,
            "training-operator",
            self.private_mounts(
                [
                    self.binary("training-operator"),
                    "--enable-scheme=pytorchjob",
                    f"--kubeconfig={self.pki / 'operators.kubeconfig'}",
                    f"--webhook-server-port={ports['training-operator-webhook']}",
                    f"--metrics-bind-address=127.0.0.1:{ports['training-operator-metrics']}",
                    f"--health-probe-bind-address=127.0.0.1:{ports['training-operator-probe']}",
                    # Its built-in init container for Worker pods fails `restricted` Pod Security;
                    # the operator chart ships one that passes (docs/operations.md, Pod Security).
                    f"--pytorch-init-container-template-file={PYTORCH_INIT_CONTAINER}",
                    # Its default image (alpine:3.10) is pulled from Docker Hub; the real node pulls
                    # nothing and holds Debian's busybox (nslookup) under this name.
                    f"--pytorch-init-container-image={busybox_image()}",
                ]
            ),
            env={"MY_POD_NAMESPACE": OPERATOR_NAMESPACE, "KUBEFLOW_NAMESPACE": ""},
        )

        def ready() -> bool:
            url = f"http://127.0.0.1:{ports['training-operator-probe']}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200

        self._wait("training-operator", ready, timeout, proc)

    # --- JobSet, Kubeflow Trainer v2 and Kueue -------------------------------------------------
    @staticmethod
    def _pod_namespace(default: str) -> str:
        """The namespace JobSet's and Trainer's certificate code looks in: a pod's ServiceAccount
        namespace file if there is one, else its default (getOperatorNamespace in both)."""
        with contextlib.suppress(OSError):
            if namespace := SERVICE_ACCOUNT_NAMESPACE.read_text().strip():
                return namespace
        return default

    @staticmethod
    def json_patch(doc: Any, ops: Iterable[Mapping[str, Any]]) -> Any:
        """RFC 6902 add/replace/remove on ``doc`` in place: the kustomize patches upstream's
        manifests come with (the subset they use)."""
        for op in ops:
            parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
            *parents, last = parts
            target = doc
            for part in parents:
                target = target[int(part)] if isinstance(target, list) else target[part]
            if isinstance(target, list):
                index = len(target) if last == "-" else int(last)
                if op["op"] == "add":
                    target.insert(index, op["value"])
                elif op["op"] == "replace":
                    target[index] = op["value"]
                else:
                    del target[index]
            elif op["op"] in ("add", "replace"):
                target[last] = op["value"]
            else:
                del target[last]
        return doc

    def webhook_configurations(
        self,
        source: Path,
        port: int,
        names: Mapping[str, str],
        patches: Mapping[str, Sequence[Path]] | None = None,
        keep: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Upstream's Mutating- and ValidatingWebhookConfiguration (kubebuilder's
        manifests.yaml), with the JSON patches its kustomization applies to each kind, named
        as its rotator expects (``names``: kind -> name) and pointed at the operator on this
        host with the project's CA; ``keep`` picks the hooks of what the cluster serves."""
        ca = base64.b64encode((self.webhook_pki() / "ca.crt").read_bytes()).decode()
        configs = []
        for doc in yaml.safe_load_all(source.read_text()):
            if not doc:
                continue
            kind = doc["kind"]
            for patch in (patches or {}).get(kind, ()):
                self.json_patch(doc, yaml.safe_load(patch.read_text()))
            doc["metadata"] = {"name": names[kind]}
            doc["webhooks"] = [h for h in doc["webhooks"] if keep is None or keep(h)]
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
            configs.append(doc)
        return configs

    def patched_webhook_configurations(
        self, pin: str, port: int, names: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """webhook_configurations of an operator in PATCHED_WEBHOOKS, with its patches."""
        folder, mutating, validating = PATCHED_WEBHOOKS[pin]
        webhook = self.module_dir(pin) / folder
        return self.webhook_configurations(
            webhook / "manifests.yaml",
            port,
            names,
            patches={
                "MutatingWebhookConfiguration": [webhook / mutating],
                "ValidatingWebhookConfiguration": [webhook / validating],
            },
        )

    def install_crds(self, kustomization: Path, port: int | None = None) -> list[str]:
        """The CRDs a kustomization lists (``resources``), with the conversion webhooks its
        ``patches`` add (pointed at ``port`` on this host with the project's CA; other patch
        content, cert-manager annotations, is left out); server-side applied, then waited for.
        Returns the CRD names."""
        folder = kustomization.parent
        spec = yaml.safe_load(kustomization.read_text())
        crds = [yaml.safe_load((folder / rel).read_text()) for rel in spec.get("resources", [])]
        by_name = {crd["metadata"]["name"]: crd for crd in crds}
        ca = base64.b64encode((self.webhook_pki() / "ca.crt").read_bytes()).decode()
        for entry in spec.get("patches", []):
            patch = yaml.safe_load((folder / entry["path"]).read_text())
            conversion = (patch.get("spec") or {}).get("conversion")
            if not conversion or port is None:
                continue
            client = conversion["webhook"]["clientConfig"]
            path = client["service"].get("path", "/convert")
            conversion["webhook"]["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": ca,
            }
            by_name[patch["metadata"]["name"]]["spec"]["conversion"] = conversion
        self.apply(crds, server_side=True)
        for name in by_name:
            self.wait_established(name)
        return list(by_name)

    def _operator_config(self, name: str, source: Path, overrides: Mapping[str, Any]) -> Path:
        """Upstream's controller-manager configuration file with ``overrides`` merged in."""

        def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
            for key, value in extra.items():
                if isinstance(value, Mapping) and isinstance(base.get(key), dict):
                    merge(base[key], value)
                else:
                    base[key] = value
            return base

        config = merge(yaml.safe_load(source.read_text()), overrides)
        path = self.root / f"{name}-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _install_webhooks(
        self, namespace: str, secret: str, configs: Sequence[Mapping[str, Any]]
    ) -> None:
        """The operator's namespace, its pre-made Secret and webhook configurations, and the
        serving certificate where its webhook server reads it."""
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        self.apply([ns, self.webhook_secret(namespace, secret), *configs])
        self.mount_webhook_certs()

    def _wait_operator(
        self,
        name: str,
        proc: subprocess.Popen,
        probe_port: int,
        webhook_port: int,
        configs: Sequence[Mapping[str, Any]],
        timeout: float,
    ) -> None:
        """Until its /readyz answers (certificates ready, webhook server started) and every
        hook path is registered: the controllers and webhooks are set up in a goroutine after
        the certificates, so /readyz can pass before a path answers anything but 404."""

        def ready() -> bool:
            url = f"http://127.0.0.1:{probe_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200

        self._wait(name, ready, timeout, proc)
        ctx = ssl.create_default_context(cafile=str(self.webhook_pki() / "ca.crt"))
        urls = {h["clientConfig"]["url"] for c in configs for h in c["webhooks"]}
        paths = sorted(urllib.parse.urlsplit(url).path for url in urls)

        def served() -> bool:
            for path in paths:
                request = urllib.request.Request(
                    f"https://127.0.0.1:{webhook_port}{path}",
                    data=b"{}",
                    headers={"Content-Type": "application/json"},
                )
                try:
                    urllib.request.urlopen(request, timeout=2, context=ctx).close()
                except urllib.error.HTTPError as err:
                    if err.code == 404:
                        return False
            return True

        self._wait(f"{name} webhooks", served, timeout, proc, log=name)

    def _start_jobset(self, state: dict[str, Any], timeout: float) -> None:
        """JobSet v0.12.0: its CRD, webhooks and Secret, then its manager (main.go) with
        upstream's config file (config/components/manager) bound to 127.0.0.1."""
        ports = state["ports"]
        module = self.module_dir("jobset")
        components = module / "config/components"
        self.install_crds(components / "crd/kustomization.yaml", ports["jobset-webhook"])
        configs = self.patched_webhook_configurations(
            "jobset", ports["jobset-webhook"], JOBSET_WEBHOOK_CONFIGS
        )
        self._install_webhooks(self._pod_namespace(JOBSET_NAMESPACE), JOBSET_SECRET, configs)
        self._run_manager(
            state,
            "jobset",
            "jobset",
            components / "manager/controller_manager_config.yaml",
            configs,
            timeout,
        )

    def _start_trainer(self, state: dict[str, Any], timeout: float) -> None:
        """Kubeflow Trainer v2.3.0's controller manager: its CRDs (manifests/base/crds), its
        webhooks with upstream's kustomize patches (manifests/base/webhook), its Secret, and
        upstream's config file (manifests/base/manager) bound to 127.0.0.1. No
        ClusterTrainingRuntimes: the controller creates a TrainingRuntime per run. JobSet's CRD
        must be served first (its jobset plugin only logs when it is not, then never watches)."""
        ports = state["ports"]
        base = self.module_dir("trainer") / "manifests/base"
        self.install_crds(base / "crds/kustomization.yaml")
        configs = self.patched_webhook_configurations(
            "trainer", ports["trainer-webhook"], TRAINER_WEBHOOK_CONFIGS
        )
        namespace = self._pod_namespace(TRAINER_NAMESPACE)
        self._install_webhooks(namespace, TRAINER_SECRET, configs)
        # The TrainJobStatus gate: the status server on its own port (it binds ":<port>", all
        # interfaces: StatusServer has no host field) and the plugin that gives the trainer's
        # pods its URL, CA and a token (docs/trainer-v2.md, Progress).
        proc = self._run_manager(
            state,
            "trainer",
            "trainer-controller-manager",
            base / "manager/controller_manager_config.yaml",
            configs,
            timeout,
            extra={
                "featureGates": {TRAINER_STATUS_GATE: True},
                "statusServer": {"port": ports["trainer-status"]},
            },
            pod_files=self._pod_files(namespace),
        )
        # It listens once its token authorizer found the issuer (OIDC discovery through the
        # manager's own client: no anonymous access to the discovery endpoints is needed).
        port = ports["trainer-status"]
        self._wait(
            "trainer status server",
            lambda: self._status_server_up(port),
            timeout,
            proc,
            log="trainer",
        )

    def _pod_files(self, namespace: str) -> Path:
        """The folder that Trainer's manager sees as a pod of its own ServiceAccount would
        (private_mounts): Trainer v2.3.0 reads the token issuer from
        /var/run/secrets/kubernetes.io/serviceaccount/token (getClusterOIDCIssuerURL in
        pkg/statusserver/auth.go, a fixed path) and fails its status server without it. The
        token is a real one (TokenRequest), in the state folder; the namespace file holds what
        the pod's would (the namespace Trainer's certificate code uses, see _pod_namespace)."""
        self.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": TRAINER_SERVICE_ACCOUNT, "namespace": namespace},
                }
            ]
        )
        token = self.kubectl(
            "create", "token", TRAINER_SERVICE_ACCOUNT, "-n", namespace, "--duration=24h"
        ).stdout.strip()
        folder = private_dir(self.root / "trainer-serviceaccount")
        for name, text in (("token", token), ("namespace", namespace)):
            write_private(folder / name, text)
        return folder

    def _status_server_up(self, port: int) -> bool:
        """Trainer's status server answers (404 for a path it does not serve), over TLS with
        the webhook serving certificate it shares (pkg/util/cert SetupTLSConfig)."""
        ctx = ssl.create_default_context(cafile=str(self.webhook_pki() / "ca.crt"))
        try:
            urllib.request.urlopen(f"https://127.0.0.1:{port}/", timeout=2, context=ctx).close()
        except urllib.error.HTTPError as err:
            return err.code == 404
        return False

    def _run_manager(
        self,
        state: dict[str, Any],
        name: str,
        binary: str,
        manager_config: Path,
        configs: list[dict[str, Any]],
        timeout: float,
        extra: Mapping[str, Any] | None = None,
        cert_dir: bool = False,
        pod_files: Path | None = None,
    ) -> subprocess.Popen:
        """A controller-runtime manager from upstream's config file, bound to 127.0.0.1 with
        this cluster's ports and no leader election, then its readiness (and its webhooks');
        ``cert_dir``: it reads its webhook certificate from the folder its configuration names
        (webhook.certDir), else it runs under private_mounts() (with ``pod_files``)."""
        ports = state["ports"]
        webhook: dict[str, Any] = {"port": ports[f"{name}-webhook"], "host": "127.0.0.1"}
        if cert_dir:
            webhook["certDir"] = str(self.webhook_cert_dir)
        config = self._operator_config(
            name,
            manager_config,
            {
                "leaderElection": {"leaderElect": False},
                "webhook": webhook,
                "metrics": {"bindAddress": f"127.0.0.1:{ports[f'{name}-metrics']}"},
                "health": {"healthProbeBindAddress": f"127.0.0.1:{ports[f'{name}-probe']}"},
                **(extra or {}),
            },
        )
        command = [
            self.binary(binary),
            f"--config={config}",
            f"--kubeconfig={self.pki / 'operators.kubeconfig'}",
            "--zap-log-level=2",
        ]
        if not cert_dir:
            command = self.private_mounts(command, pod_files)
        proc = self._spawn(state, name, command)
        self._wait_operator(
            name, proc, ports[f"{name}-probe"], ports[f"{name}-webhook"], configs, timeout
        )
        return proc

    def _start_kueue(self, state: dict[str, Any], timeout: float) -> None:
        """Kueue v0.19.0 with only its TrainJob and PyTorchJob integrations: its CRDs with
        their conversion webhooks (config/components/crd; its rotator injects the CA into five
        of them and fails without their clientConfig), the webhooks of its own kinds and of
        those two, its Secret and upstream's config file (config/components/manager) bound to
        127.0.0.1, without the visibility API server (an aggregated API on :8082)."""
        ports = state["ports"]
        components = self.module_dir("kueue") / "config/components"
        self.install_crds(components / "crd/kustomization.yaml", ports["kueue-webhook"])
        namespace = KUEUE_NAMESPACE

        configs = self.webhook_configurations(
            components / "webhook/manifests.yaml",
            ports["kueue-webhook"],
            KUEUE_WEBHOOK_CONFIGS,
            keep=kueue_hook_kept,
        )
        # Upstream's kustomization gives every job kind's hooks this namespaceSelector.
        for config in configs:
            for hook in config["webhooks"]:
                if hook["rules"][0]["apiGroups"][0] in KUEUE_JOB_RESOURCES:
                    hook["namespaceSelector"] = {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/metadata.name",
                                "operator": "NotIn",
                                "values": ["kube-system", namespace],
                            }
                        ]
                    }
        self._install_webhooks(namespace, KUEUE_SECRET, configs)
        self._run_manager(
            state,
            "kueue",
            "kueue",
            components / "manager/controller_manager_config.yaml",
            configs,
            timeout,
            extra={
                "namespace": namespace,
                "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)},
                "featureGates": {"VisibilityOnDemand": False},
            },
            cert_dir=True,
        )
