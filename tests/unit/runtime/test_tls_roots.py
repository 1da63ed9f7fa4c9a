"""aiohttp imported with its trusted roots loaded on a thread: what each of its TLS
contexts holds once they are loaded, and what is left as it was.

Each case that imports aiohttp runs in a fresh interpreter (this one has imported it).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import textwrap

from sidecar.runtime import tls_roots


def in_a_fresh_interpreter(code: str) -> dict[str, object]:
    """Run ``code`` (which sets ``out``) in a new interpreter; return ``out``."""
    program = "import json\n" + textwrap.dedent(code) + "\nprint(json.dumps(out))"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout)
    return found


def test_the_verifying_context_gets_the_system_roots_and_the_other_none() -> None:
    out = in_a_fresh_interpreter(
        """
        import ssl
        from sidecar.runtime import tls_roots
        real = ssl.SSLContext.set_default_verify_paths
        tls_roots.import_aiohttp()
        tls_roots.wait_for_roots()
        from aiohttp import connector
        out = {
            "verified": connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"],
            "unverified": connector._SSL_CONTEXT_UNVERIFIED.cert_store_stats()["x509_ca"],
            "system": ssl.create_default_context().cert_store_stats()["x509_ca"],
            "restored": ssl.SSLContext.set_default_verify_paths is real,
        }
        """
    )
    assert out["system"], "this machine has no trusted roots to compare with"
    assert out["verified"] == out["system"]
    assert out["unverified"] == 0  # CERT_NONE: it never looks at a root
    assert out["restored"] is True


def test_a_failure_to_load_the_roots_is_raised_by_the_wait() -> None:
    out = in_a_fresh_interpreter(
        """
        import ssl
        from sidecar.runtime import tls_roots
        def unreadable(context):
            raise ssl.SSLError("no roots here")
        ssl.SSLContext.set_default_verify_paths = unreadable
        tls_roots.import_aiohttp()
        try:
            tls_roots.wait_for_roots()
        except ssl.SSLError as error:
            out = {"raised": error.args[0]}
        else:
            out = {"raised": None}
        """
    )
    assert out["raised"] == "no roots here"


def test_once_aiohttp_is_imported_nothing_is_held_back() -> None:
    assert "aiohttp" in sys.modules  # by this test run
    load = ssl.SSLContext.set_default_verify_paths
    tls_roots.import_aiohttp()
    tls_roots.wait_for_roots()  # returns at once: nothing is loading
    assert ssl.SSLContext.set_default_verify_paths is load


def test_a_process_that_does_not_ask_imports_aiohttp_as_it_is() -> None:
    out = in_a_fresh_interpreter(
        """
        import sidecar.runtime.tls_roots
        from aiohttp import connector
        out = {"verified": connector._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"]}
        """
    )
    assert out["verified"] > 0
