"""``sidecar webhook``: serve the mutating admission webhook that injects the sidecar."""

from __future__ import annotations

import argparse
import asyncio
import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.errors import ConfigError
from sidecar.runtime import logs

if TYPE_CHECKING:
    from sidecar.kube.selfsigned import SelfSignedTLS

DEFAULT_LISTEN = "0.0.0.0:8443"  # the API server calls it from outside the pod
DEFAULT_RELOAD_S = 10.0  # sidecar.kube.webhook.DEFAULT_RELOAD_S, without importing it here
# sidecar.kube.selfsigned's and sidecar.kube.apiclient's defaults, likewise (the CLI
# imports only what the verb it runs needs; tests/unit/cli/test_webhook.py compares them)
DEFAULT_CONFIGURATION = "effect-sidecar"
DEFAULT_SERVICE = "effect-sidecar-webhook"
DEFAULT_RENEW_BEFORE_DAYS = 30.0
DEFAULT_CHECK_S = 600.0
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds: {text!r}")
    return value


def positive_days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of days: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 days: {text!r}")
    return value


def register(verbs: Any) -> None:
    parser: argparse.ArgumentParser = verbs.add_parser(
        "webhook",
        help="serve the Kubernetes admission webhook that injects the sidecar",
        description="Serve POST /mutate (AdmissionReview v1 for Pod CREATE: a JSON Patch "
        'that injects the sidecar into pods with effect-sidecar.io/inject: "true") and '
        "GET /healthz over TLS. Prints 'effect-sidecar webhook ready https://HOST:PORT' and "
        "runs until SIGTERM/SIGINT. TLS comes from files (--tls-cert/--tls-key: "
        "cert-manager's or your own) or is self-signed (--self-signed-secret). The "
        "certificate and key files are checked every --reload-s seconds: a renewed pair "
        "(e.g. cert-manager's, swapped in by kubelet) is served to new connections; a "
        "half-written or mismatched pair is logged and the old certificate kept.",
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve on (default {DEFAULT_LISTEN}; port 0 picks one)",
    )
    parser.add_argument("--tls-cert", type=Path, metavar="FILE", help="serving certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, metavar="FILE", help="its private key (PEM)")
    parser.add_argument(
        "--reload-s",
        type=positive_seconds,
        default=DEFAULT_RELOAD_S,
        metavar="SECONDS",
        help="how often to check the certificate files for a renewal "
        f"(default {DEFAULT_RELOAD_S:g})",
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="injection configuration (YAML)"
    )
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info"
    )
    self_signed = parser.add_argument_group(
        "self-signed TLS (instead of --tls-cert/--tls-key)",
        "The webhook makes a CA and a serving certificate for the Service, keeps them in a "
        "kubernetes.io/tls Secret of its namespace (replicas converge on one, with "
        "optimistic concurrency), writes the pair into --cert-dir and serves it, and sets "
        "the caBundle of every webhook of its MutatingWebhookConfiguration. It talks to the "
        "Kubernetes API as the pod's service account, which needs get/create/update on "
        "the Secret and get/patch on the configuration "
        "(deploy/webhook/overlays/self-signed). Nothing listens until that is done; "
        "failures are logged and retried with back-off. Every --self-signed-check-s "
        "it checks again: a certificate within --renew-before-days of its end is "
        "renewed (by the same CA, so the caBundle stays), one another replica renewed "
        "is taken up, a caBundle that was reset is set again.",
    )
    self_signed.add_argument(
        "--self-signed-secret", metavar="NAME", help="the Secret that holds the certificate"
    )
    self_signed.add_argument(
        "--cert-dir",
        type=Path,
        metavar="DIR",
        help="where the pair is written and served from (an emptyDir: root is read-only)",
    )
    self_signed.add_argument(
        "--webhook-configuration",
        default=DEFAULT_CONFIGURATION,
        metavar="NAME",
        help=f"the MutatingWebhookConfiguration to set the caBundle of "
        f"(default {DEFAULT_CONFIGURATION})",
    )
    self_signed.add_argument(
        "--service",
        default=DEFAULT_SERVICE,
        metavar="NAME[.NAMESPACE]",
        help="the Service the API server calls; the certificate is for "
        "NAME.NAMESPACE.svc and NAME.NAMESPACE.svc.cluster.local "
        f"(default {DEFAULT_SERVICE}, in --namespace)",
    )
    self_signed.add_argument(
        "--renew-before-days",
        type=positive_days,
        default=DEFAULT_RENEW_BEFORE_DAYS,
        metavar="DAYS",
        help="renew the serving certificate (valid 365 days) when it has less than this "
        f"left (default {DEFAULT_RENEW_BEFORE_DAYS:g})",
    )
    self_signed.add_argument(
        "--self-signed-check-s",
        type=positive_seconds,
        default=DEFAULT_CHECK_S,
        metavar="SECONDS",
        help=f"how often to check the Secret and the caBundle again (default {DEFAULT_CHECK_S:g})",
    )
    api = parser.add_argument_group(
        "Kubernetes API (self-signed TLS only; defaults: the pod's service account)"
    )
    api.add_argument(
        "--kube-api",
        metavar="URL",
        help="the API server (default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)",
    )
    api.add_argument(
        "--kube-token-file",
        type=Path,
        metavar="FILE",
        help=f"bearer token, re-read for every request (default {SERVICE_ACCOUNT}/token)",
    )
    api.add_argument(
        "--kube-ca-file",
        type=Path,
        metavar="FILE",
        help=f"the only CA trusted for the API server (default {SERVICE_ACCOUNT}/ca.crt)",
    )
    api.add_argument(
        "--namespace",
        metavar="NAMESPACE",
        help=f"the webhook's namespace, where the Secret is (default: {SERVICE_ACCOUNT}/namespace)",
    )
    parser.set_defaults(run=run)


def tls_mode(args: argparse.Namespace) -> None:
    """Refuse an incomplete or mixed choice of TLS source."""
    files = args.tls_cert is not None or args.tls_key is not None
    if files and args.self_signed_secret is not None:
        raise ConfigError("give --tls-cert/--tls-key or --self-signed-secret, not both")
    if args.self_signed_secret is not None:
        if args.cert_dir is None:
            raise ConfigError("--self-signed-secret needs --cert-dir (where the pair is written)")
    elif args.tls_cert is None or args.tls_key is None:
        raise ConfigError("give --tls-cert and --tls-key, or --self-signed-secret and --cert-dir")


def self_signed_tls(args: argparse.Namespace) -> SelfSignedTLS:
    """The self-signed mode as the arguments describe it."""
    from sidecar.kube.apiclient import Credentials, pod_namespace  # noqa: PLC0415
    from sidecar.kube.selfsigned import SelfSignedTLS, Settings  # noqa: PLC0415

    try:
        credentials = Credentials.in_cluster(args.kube_api, args.kube_ca_file, args.kube_token_file)
        namespace = args.namespace or pod_namespace()
        service, _, service_namespace = args.service.partition(".")
        settings = Settings(
            namespace=namespace,
            secret=args.self_signed_secret,
            cert_dir=args.cert_dir,
            configuration=args.webhook_configuration,
            service=service,
            service_namespace=service_namespace or None,
            renew_before=datetime.timedelta(days=args.renew_before_days),
            check_s=args.self_signed_check_s,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return SelfSignedTLS(settings, credentials)


def run(args: argparse.Namespace) -> int:
    from sidecar.kube.config import load_config  # noqa: PLC0415 - only this verb needs it
    from sidecar.kube.webhook import serve  # noqa: PLC0415

    tls_mode(args)
    logs.configure(args.log_level)
    config = load_config(args.config)
    if args.self_signed_secret is not None:
        provider = self_signed_tls(args)
        cert, key = provider.cert, provider.key
        asyncio.run(serve(args.listen, cert, key, config, args.reload_s, provider))
    else:
        asyncio.run(serve(args.listen, args.tls_cert, args.tls_key, config, args.reload_s))
    return 0
