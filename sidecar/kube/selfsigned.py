"""The webhook's self-signed TLS mode: one certificate for every replica, kept in a Secret
of the webhook's namespace, served from ``--cert-dir``, trusted by the API server through
the ``caBundle`` of the webhook's own MutatingWebhookConfiguration.

:meth:`SelfSignedTLS.reconcile` is one pass:

1. Read the Secret. If it is missing, unreadable, does not cover the Service's names or
   expires within ``renew_before``, make a new bundle (:mod:`sidecar.kube.certgen`) and
   write it with optimistic concurrency: *create* - ``409 AlreadyExists`` means another
   replica was first, so start over and take theirs - or *update* with the
   ``resourceVersion`` that was read - ``409 Conflict`` means it changed since, so start
   over. Replicas that start together therefore converge on one certificate.
2. Write the pair into the cert directory (:mod:`sidecar.kube.certfiles`).
3. Set ``clientConfig.caBundle`` of every webhook of the configuration, if any differs:
   a JSON Patch whose first operation tests the ``resourceVersion`` that was read, so
   a concurrent change fails it (``422``) and the pass reads again.

:meth:`SelfSignedTLS.ensure` repeats the pass, with back-off, until it succeeds - the
webhook does not listen before that, so its readiness probe fails until it has TLS.
:meth:`SelfSignedTLS.maintain` repeats it every ``check_s`` for the life of the pod: it
renews the certificate before it expires, takes up one another replica renewed, and puts
back a ``caBundle`` someone reset. A failed pass is logged and retried sooner, and the
pair already served stays in use.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.kube import certfiles, certgen
from sidecar.kube.apiclient import Credentials, KubeApiError, KubeClient

log = logging.getLogger("sidecar.kube.selfsigned")

DEFAULT_CHECK_S = 600.0
DEFAULT_CONFIGURATION = "effect-sidecar"
DEFAULT_SERVICE = "effect-sidecar-webhook"
# how many times one pass starts over after losing a race (409 / failed test op) before
# it gives up and leaves it to the next, backed-off pass
ROUNDS = 5
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 30.0
LABELS = {"app.kubernetes.io/name": "effect-sidecar-webhook"}

HINTS = {
    "Unauthorized": "the API refused the service account token (is it mounted?)",
    "Forbidden": "the service account lacks a permission: see the Role and ClusterRole "
    "of deploy/webhook/overlays/self-signed",
    "Unreachable": "the Kubernetes API could not be reached",
    "Credentials": "the service account's files could not be read (is the token mounted?)",
    "NotFound": "does --webhook-configuration name the MutatingWebhookConfiguration applied?",
}


@dataclass(frozen=True)
class Settings:
    """What the mode manages: the Secret, the configuration, the names, the files."""

    namespace: str  # the webhook's own: where the Secret is
    secret: str
    cert_dir: Path
    configuration: str = DEFAULT_CONFIGURATION
    service: str = DEFAULT_SERVICE
    service_namespace: str | None = None  # the Service's, if not the webhook's own
    renew_before: datetime.timedelta = certgen.DEFAULT_RENEW_BEFORE
    check_s: float = DEFAULT_CHECK_S

    def __post_init__(self) -> None:
        if not datetime.timedelta(0) < self.renew_before < certgen.SERVING_VALIDITY:
            # at or beyond the validity, every new certificate would be due at once
            raise ValueError(
                f"the renewal window must be more than 0 and less than "
                f"{certgen.SERVING_VALIDITY.days} days, not {self.renew_before}"
            )
        if not self.check_s > 0:
            raise ValueError(f"the check interval must be positive, not {self.check_s}")

    @property
    def names(self) -> tuple[str, str]:
        return certgen.dns_names(self.service, self.service_namespace or self.namespace)


def backoff() -> Iterator[float]:
    """0.5 s, 1 s, 2 s, ... up to 30 s, then 30 s."""
    delay = FIRST_RETRY_S
    while True:
        yield delay
        delay = min(delay * 2, MAX_RETRY_S)


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class SelfSignedTLS:
    """The mode for one webhook process; :meth:`ensure` at start, then :meth:`maintain`."""

    def __init__(
        self,
        settings: Settings,
        credentials: Credentials,
        now: Callable[[], datetime.datetime] = utc_now,
    ) -> None:
        self.settings = settings
        self.credentials = credentials
        self.now = now
        self.cert, self.key = certfiles.paths(settings.cert_dir)

    async def reconcile(self) -> certgen.Bundle:
        """One pass; the bundle now in the Secret, the files and the ``caBundle``."""
        async with KubeClient(self.credentials) as api:
            bundle = await self._converge_secret(api)
            if certfiles.write_pair(self.settings.cert_dir, bundle.tls_crt, bundle.tls_key):
                log.info(
                    "webhook certificate written",
                    extra={"cert": str(self.cert), **describe(bundle)},
                )
            await self._patch_ca_bundle(api, bundle)
        return bundle

    async def ensure(self) -> certgen.Bundle:
        """:meth:`reconcile` until it succeeds, logging each failure and backing off."""
        delays = backoff()
        while True:
            try:
                return await self.reconcile()
            except (KubeApiError, OSError) as error:
                delay = next(delays)
                report(error, delay)
                await asyncio.sleep(delay)

    async def maintain(self, changed: Callable[[], object] = lambda: None) -> None:
        """:meth:`reconcile` every ``check_s`` seconds until cancelled; ``changed`` is
        called after a pass that wrote a new pair (to reload it at once)."""
        delays = backoff()
        delay = self.settings.check_s
        while True:
            await asyncio.sleep(delay)
            before = certfiles.read_pair(self.settings.cert_dir)
            try:
                await self.reconcile()
            except Exception as error:  # keep serving what we have; a bug must not stop it
                delay = min(next(delays), self.settings.check_s)
                report(error, delay)
            else:
                delays, delay = backoff(), self.settings.check_s
            # also after a failed pass: it may have written the pair before failing
            if certfiles.read_pair(self.settings.cert_dir) != before:
                changed()

    async def _converge_secret(self, api: KubeClient) -> certgen.Bundle:
        settings = self.settings
        where = f"{settings.namespace}/{settings.secret}"
        for _ in range(ROUNDS):
            secret = await api.get_secret(settings.namespace, settings.secret)
            previous: certgen.Bundle | None = None
            if secret is None:
                why = "it does not exist"
            else:
                try:
                    previous = certgen.Bundle.from_secret_data(secret.get("data") or {})
                except certgen.Unusable as exc:
                    why = f"it cannot be read ({exc})"
                else:
                    found = certgen.problem(
                        previous, settings.names, self.now(), settings.renew_before
                    )
                    if found is None:
                        return previous
                    why = found
            bundle = certgen.make(settings.names, self.now(), previous, settings.renew_before)
            try:
                if secret is None:
                    await api.create_secret(settings.namespace, self._new_secret(bundle))
                else:
                    secret["data"] = bundle.secret_data()  # the type stays: it is immutable
                    await api.update_secret(settings.namespace, secret)
            except KubeApiError as error:
                # lost a race: created by another, changed, or deleted since it was read
                if error.reason in {"AlreadyExists", "Conflict", "NotFound"}:
                    log.info(
                        "another writer changed the webhook certificate's Secret first; "
                        "reading it again",
                        extra={"secret": where, "reason": error.reason},
                    )
                    continue
                raise
            log.info(
                f"webhook certificate {'created' if secret is None else 'renewed'} "
                f"in Secret {where}: {why}",
                extra={"secret": where, **describe(bundle)},
            )
            return bundle
        raise KubeApiError(
            "PUT", where, "Conflict", f"the Secret kept changing under {ROUNDS} attempts"
        )

    def _new_secret(self, bundle: certgen.Bundle) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.settings.secret,
                "namespace": self.settings.namespace,
                "labels": dict(LABELS),
            },
            "type": "kubernetes.io/tls",
            "data": bundle.secret_data(),
        }

    async def _patch_ca_bundle(self, api: KubeClient, bundle: certgen.Bundle) -> None:
        name = self.settings.configuration
        want = bundle.ca_bundle
        for _ in range(ROUNDS):
            configuration = await api.get_webhook_configuration(name)
            webhooks = configuration.get("webhooks") or []
            stale = [
                index
                for index, webhook in enumerate(webhooks)
                if (webhook.get("clientConfig") or {}).get("caBundle") != want
            ]
            if not webhooks:
                log.warning(
                    "the MutatingWebhookConfiguration has no webhooks to give the CA",
                    extra={"configuration": name},
                )
            if not stale:
                return
            # the test op makes the indexes safe: they are those of the version just read
            patch: list[dict[str, Any]] = [
                {
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": configuration["metadata"]["resourceVersion"],
                }
            ]
            patch += [
                {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": want}
                for index in stale
            ]
            try:
                await api.patch_webhook_configuration(name, patch)
            except KubeApiError as error:
                if error.reason in {"Invalid", "Conflict"}:
                    continue  # changed since it was read
                raise
            log.info(
                f"caBundle of MutatingWebhookConfiguration {name} set",
                extra={"configuration": name, "webhooks": len(stale)},
            )
            return
        raise KubeApiError(
            "PATCH", name, "Conflict", f"the configuration kept changing under {ROUNDS} attempts"
        )


def describe(bundle: certgen.Bundle) -> dict[str, str]:
    """What identifies the served certificate in the log (never a key)."""
    cert = bundle.certificate
    return {"serial": f"{cert.serial_number:x}", "not_after": cert.not_valid_after_utc.isoformat()}


def report(error: BaseException, retry_in_s: float) -> None:
    """One warning per failed pass: what failed, a hint, when it is tried again."""
    reason = error.reason if isinstance(error, KubeApiError) else type(error).__name__
    hint = HINTS.get(reason, "")
    log.warning(
        f"webhook TLS (self-signed) not set up: {error}"
        + (f" - {hint}" if hint else "")
        + f"; retrying in {retry_in_s:g}s",
        extra={"reason": reason, "retry_in_s": retry_in_s},
        exc_info=not isinstance(error, KubeApiError | OSError),
    )
