"""Build an API client from the in-cluster service account or a kubeconfig, with errors that say what to fix."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import urllib3
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from autoscaler import __version__
from autoscaler.ports import PortError

USER_AGENT_PRODUCT = "gpu-autoscaler"  # the User-Agent's product: the field manager of every write the controller makes

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

ConfigMode = Literal["auto", "in-cluster", "kubeconfig"]


class KubeConfigError(PortError):
    """No usable cluster configuration; the message names what was tried and the setting to change."""


def in_cluster_available(sa_dir: Path = SERVICE_ACCOUNT_DIR) -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (sa_dir / "token").exists()


def _no_auto_retries(cfg: client.Configuration) -> None:
    # urllib3's default retries a timed-out GET three times (4x the timeout before anyone hears of it) and would
    # hide faults from our own bounded retries. Only a refused connection - the request never left - is retried.
    cfg.retries = urllib3.Retry(total=1, connect=1, read=0, status=0, other=0, redirect=0, raise_on_status=False)


def load_api_client(
    mode: ConfigMode = "auto",
    kubeconfig: str | Path | None = None,
    context: str | None = None,
) -> client.ApiClient:
    """An ``ApiClient`` of its own (the global default configuration is left alone).

    ``auto``: in-cluster when ``KUBERNETES_SERVICE_HOST`` is set and a service-account token is mounted, else the
    kubeconfig (``kubeconfig`` argument, then ``$KUBECONFIG``, then ``~/.kube/config``).
    """
    if mode not in ("auto", "in-cluster", "kubeconfig"):
        raise KubeConfigError(f"kubernetes.config_mode: unknown mode {mode!r} (auto | in-cluster | kubeconfig)")
    cfg = client.Configuration()
    use_in_cluster = mode == "in-cluster" or (mode == "auto" and kubeconfig is None and in_cluster_available())
    if use_in_cluster:
        try:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except ConfigException as exc:
            raise KubeConfigError(
                f"in-cluster config failed: {exc}. It needs KUBERNETES_SERVICE_HOST/PORT and a service-account "
                f"token in {SERVICE_ACCOUNT_DIR} (automountServiceAccountToken); outside a cluster set "
                "AUTOSCALER_KUBERNETES__CONFIG_MODE=kubeconfig"
            ) from None
    else:
        path = Path(kubeconfig).expanduser() if kubeconfig is not None else None
        if path is not None and not path.exists():
            raise KubeConfigError(
                f"kubeconfig {path} does not exist (AUTOSCALER_KUBERNETES__KUBECONFIG / --kubeconfig)"
            )
        config_file = str(path) if path is not None else None
        if path is None:
            # Read $KUBECONFIG now: the client library reads it once, at import time.
            env = os.environ.get("KUBECONFIG")
            candidates = (
                [Path(p).expanduser() for p in env.split(os.pathsep) if p]
                if env
                else [Path("~/.kube/config").expanduser()]
            )
            if not any(p.exists() for p in candidates):
                where = "$KUBECONFIG=" + env if env else "~/.kube/config"
                hint = "" if mode == "kubeconfig" else " and no in-cluster service account was found"
                raise KubeConfigError(
                    f"no kubeconfig at {where}{hint}; set AUTOSCALER_KUBERNETES__KUBECONFIG or KUBECONFIG"
                )
            config_file = os.pathsep.join(str(p) for p in candidates if p.exists())
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=config_file,
                context=context,
                client_configuration=cfg,
                persist_config=False,
            )
        except ConfigException as exc:
            raise KubeConfigError(
                f"kubeconfig {path or os.environ.get('KUBECONFIG') or '~/.kube/config'}: {exc}"
                + (" (AUTOSCALER_KUBERNETES__CONTEXT)" if context else "")
            ) from None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise KubeConfigError(
                f"kubeconfig {path or '(default)'} is not usable: {type(exc).__name__}: {exc}"
            ) from None
    _no_auto_retries(cfg)
    api = client.ApiClient(cfg)
    # Audit logs and managedFields name the writer after the User-Agent (the client's default is the generic
    # "OpenAPI-Generator/..."): the controller's scale and status writes must say they are its own.
    api.user_agent = f"{USER_AGENT_PRODUCT}/{__version__}"
    return api
