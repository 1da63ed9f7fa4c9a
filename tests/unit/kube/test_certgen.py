"""The self-signed mode's certificates: what :func:`make` makes passes a strict RFC 5280
verifier for the Service's names; :func:`problem` finds each reason to replace a bundle;
a renewal keeps a good CA and a CA rotation keeps the old CA trusted."""

from __future__ import annotations

import base64
import datetime

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import DNSName, PolicyBuilder, Store

from sidecar.kube import certgen
from sidecar.kube.certgen import Bundle, make, problem
from tests.support import certs

NAMES = certgen.dns_names("effect-sidecar-webhook", "effect-sidecar-system")
NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)


def verify(bundle: Bundle, name: str, at: datetime.datetime = NOW) -> None:
    """Raises unless ``tls.crt`` chains to the first CA of ``ca.crt`` for ``name``."""
    cas = x509.load_pem_x509_certificates(bundle.ca_crt)
    verifier = PolicyBuilder().store(Store(cas)).time(at).build_server_verifier(DNSName(name))
    verifier.verify(bundle.certificate, [])


@pytest.fixture(scope="module")
def fresh() -> Bundle:
    return make(NAMES, NOW)


def test_a_new_bundle_verifies_for_both_service_names(fresh: Bundle):
    assert NAMES == (
        "effect-sidecar-webhook.effect-sidecar-system.svc",
        "effect-sidecar-webhook.effect-sidecar-system.svc.cluster.local",
    )
    for name in NAMES:
        verify(fresh, name)
    with pytest.raises(x509.verification.VerificationError):
        verify(fresh, "other.effect-sidecar-system.svc")
    cert = fresh.certificate
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.not_valid_after_utc == NOW + certgen.SERVING_VALIDITY
    ca = x509.load_pem_x509_certificate(fresh.ca_crt)
    assert ca.not_valid_after_utc == NOW + certgen.CA_VALIDITY
    assert problem(fresh, NAMES, NOW) is None


def test_the_secret_data_round_trips(fresh: Bundle):
    data = fresh.secret_data()
    assert set(data) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    assert Bundle.from_secret_data(data) == fresh
    assert base64.b64decode(fresh.ca_bundle) == fresh.ca_crt
    with pytest.raises(certgen.Unusable, match=r"no ca\.key"):
        Bundle.from_secret_data({k: v for k, v in data.items() if k != "ca.key"})
    with pytest.raises(certgen.Unusable, match=r"tls\.crt is not base64"):
        Bundle.from_secret_data(data | {"tls.crt": "not base64!"})


def test_it_is_renewed_within_the_window_and_not_before(fresh: Bundle):
    end = NOW + certgen.SERVING_VALIDITY
    window = datetime.timedelta(days=30)
    assert problem(fresh, NAMES, end - window - DAY, window) is None
    found = problem(fresh, NAMES, end - window + DAY, window)
    assert found is not None
    assert found.startswith("tls.crt expires at")
    assert problem(fresh, NAMES, end - 10 * DAY, datetime.timedelta(days=5)) is None


def test_a_certificate_for_other_names_is_replaced(fresh: Bundle):
    others = certgen.dns_names("effect-sidecar-webhook", "elsewhere")
    assert problem(fresh, others, NOW) == (
        "tls.crt does not cover effect-sidecar-webhook.elsewhere.svc, "
        "effect-sidecar-webhook.elsewhere.svc.cluster.local"
    )


def test_pieces_that_do_not_belong_together_are_replaced(fresh: Bundle):
    other = make(NAMES, NOW)
    assert problem(
        Bundle(fresh.tls_crt, other.tls_key, fresh.ca_crt, fresh.ca_key), NAMES, NOW
    ) == ("tls.key is not the key of tls.crt")
    assert problem(
        Bundle(other.tls_crt, other.tls_key, fresh.ca_crt, fresh.ca_key), NAMES, NOW
    ) == ("tls.crt is not signed by the CA in ca.crt")
    assert problem(
        Bundle(fresh.tls_crt, fresh.tls_key, fresh.ca_crt, other.ca_key), NAMES, NOW
    ) == ("ca.key is not an EC or RSA key of ca.crt")
    garbled = problem(Bundle(b"junk", fresh.tls_key, fresh.ca_crt, fresh.ca_key), NAMES, NOW)
    assert garbled is not None
    assert garbled.startswith("the serving certificate cannot be read")
    assert (
        problem(Bundle(fresh.tls_crt, fresh.tls_key, b"junk", fresh.ca_key), NAMES, NOW) or ""
    ).startswith("the CA cannot be read")


def test_a_leaf_posing_as_the_ca_is_replaced():
    leaf, key = certs.make_ca("not a CA", ca=False)
    bundle = make(NAMES, NOW)
    posing = Bundle(bundle.tls_crt, bundle.tls_key, certs.cert_pem(leaf), certs.key_pem(key))
    assert problem(posing, NAMES, NOW) == "ca.crt is not a CA"


def test_a_renewal_keeps_a_good_ca_so_the_ca_bundle_stays(fresh: Bundle):
    later = NOW + certgen.SERVING_VALIDITY - 10 * DAY
    renewed = make(NAMES, later, fresh)
    assert (renewed.ca_crt, renewed.ca_key) == (fresh.ca_crt, fresh.ca_key)
    assert renewed.ca_bundle == fresh.ca_bundle
    assert renewed.certificate.serial_number != fresh.certificate.serial_number
    assert problem(renewed, NAMES, later) is None
    verify(renewed, NAMES[0], later)


def test_a_ca_near_its_end_is_rotated_and_the_old_one_kept_in_the_bundle(fresh: Bundle):
    late = NOW + certgen.CA_VALIDITY - certgen.SERVING_VALIDITY + DAY
    found = problem(fresh, NAMES, late)
    assert found is not None
    assert found.startswith("the CA expires at")
    rotated = make(NAMES, late, fresh)
    cas = x509.load_pem_x509_certificates(rotated.ca_crt)
    old_ca = x509.load_pem_x509_certificate(fresh.ca_crt)
    assert len(cas) == 2
    assert cas[1] == old_ca  # replicas still serving the old CA's certificate stay trusted
    assert cas[0] != old_ca
    assert problem(rotated, NAMES, late) is None
    verify(rotated, NAMES[1], late)
    # and the next rotation drops a CA that has expired meanwhile
    much_later = late + certgen.CA_VALIDITY - certgen.SERVING_VALIDITY + DAY
    again = make(NAMES, much_later, rotated)
    assert len(x509.load_pem_x509_certificates(again.ca_crt)) == 2
    assert old_ca not in x509.load_pem_x509_certificates(again.ca_crt)


def test_a_serving_certificate_never_outlives_its_ca(fresh: Bundle):
    ca_end = x509.load_pem_x509_certificate(fresh.ca_crt).not_valid_after_utc
    near = ca_end - certgen.SERVING_VALIDITY - DAY  # the CA is still good, barely
    assert make(NAMES, near, fresh).certificate.not_valid_after_utc <= ca_end


def test_unreadable_previous_data_makes_a_new_ca(fresh: Bundle):
    broken = Bundle(b"", b"", b"junk", b"junk")
    made = make(NAMES, NOW, broken)
    assert made.ca_crt != fresh.ca_crt
    assert len(x509.load_pem_x509_certificates(made.ca_crt)) == 1
    assert problem(made, NAMES, NOW) is None
