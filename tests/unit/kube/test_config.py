"""The injection configuration: usable defaults, loaded from YAML, bad files named."""

from __future__ import annotations

import pytest

from sidecar.errors import ConfigError
from sidecar.kube.config import DEFAULT_IMAGE, InjectConfig, load_config


def test_no_file_means_the_defaults():
    config = load_config(None)
    assert config == InjectConfig()
    assert config.image == DEFAULT_IMAGE
    assert config.mode == "transparent"
    assert config.native_sidecar is True
    assert config.run_as_user == 1337
    assert config.store_secret is not None
    assert (config.store_secret.name, config.store_secret.key) == ("effect-sidecar-store", "url")


def test_a_yaml_file_sets_fields_with_dashes_or_underscores(tmp_path):
    path = tmp_path / "inject.yaml"
    path.write_text(
        "image: registry.acme/sidecar:1\nnative-sidecar: false\nmode: env-proxy\n"
        "store_secret: {name: store, key: url}\nnamespace: platform\n"
    )
    config = load_config(path)
    assert (config.image, config.native_sidecar, config.mode) == (
        "registry.acme/sidecar:1",
        False,
        "env-proxy",
    )
    assert config.skips("platform")
    assert config.skips("kube-system")
    assert not config.skips("agents")


def test_an_empty_file_means_the_defaults(tmp_path):
    path = tmp_path / "inject.yaml"
    path.write_text("")
    assert load_config(path) == InjectConfig()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("imagee: x\n", "imagee: Extra inputs are not permitted"),
        ("mode: sidecar\n", "mode: Input should be 'transparent' or 'env-proxy'"),
        ("run_as_user: 0\n", "run_as_user"),
        ("- a\n", "expected a mapping"),
        ("a: [\n", "not valid YAML"),
        ("ca_secret: {name: ca, key: tls.key}\n", "ca_secret: Input should be a valid string"),
        ("ca_secret: Team_CA\n", "ca_secret: String should match pattern"),
    ],
)
def test_a_bad_file_is_a_config_error_naming_the_file_and_field(tmp_path, text, message):
    path = tmp_path / "inject.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(path) in caught.value.detail
    assert message in caught.value.detail


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read injection config"):
        load_config(tmp_path / "absent.yaml")
