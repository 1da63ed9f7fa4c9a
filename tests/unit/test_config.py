"""Settings: defaults < config file < SIDECAR_* env < flags; a bad one names its source."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar import config
from sidecar.errors import ConfigError


def test_defaults_put_the_sqlite_store_in_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    settings = config.load({})
    assert settings.control_listen == config.DEFAULT_CONTROL_LISTEN
    assert settings.store_url == f"sqlite:///{tmp_path}/effect-sidecar/effects.db"


def test_flags_beat_env_which_beats_the_config_file(tmp_path, monkeypatch):
    file = tmp_path / "sidecar.yaml"
    file.write_text(
        "control_listen: 127.0.0.1:1111\nstore: sqlite:///from-file.db\nlog-level: debug\n"
    )
    monkeypatch.setenv("SIDECAR_CONTROL_LISTEN", "127.0.0.1:2222")
    settings = config.load({"store": "sqlite:///from-flag.db"}, file)
    assert settings.control_listen == "127.0.0.1:2222"
    assert settings.store == "sqlite:///from-flag.db"
    assert settings.log_level == "debug"


def test_a_bad_value_names_its_source(tmp_path, monkeypatch):
    monkeypatch.setenv("SIDECAR_CONTROL_LISTEN", "nowhere")
    with pytest.raises(ConfigError, match=r"control_listen \(environment"):
        config.load({})


def test_unknown_keys_in_the_config_file_are_refused(tmp_path):
    file = tmp_path / "sidecar.yaml"
    file.write_text("contrl_listen: 127.0.0.1:1\n")
    with pytest.raises(ConfigError, match="contrl_listen"):
        config.load({}, file)


def test_a_config_file_that_is_not_a_mapping_is_refused(tmp_path):
    file = tmp_path / "sidecar.yaml"
    file.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        config.load({}, file)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("127.0.0.1:7300", ("127.0.0.1", 7300)), (":0", ("127.0.0.1", 0)), ("[::1]:80", ("::1", 80))],
)
def test_listen_addresses_parse(value, expected):
    assert config.parse_listen(value) == expected


@pytest.mark.parametrize("value", ["7300", "host:", "host:http", "h:70000"])
def test_bad_listen_addresses_are_refused(value):
    with pytest.raises(ConfigError):
        config.parse_listen(value)


def test_the_token_comes_from_its_file_stripped(tmp_path):
    token_file: Path = tmp_path / "token"
    token_file.write_text("s3cret\n")
    assert config.load({"control_token_file": token_file}).token() == "s3cret"
    token_file.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        config.load({"control_token_file": token_file}).token()


def test_list_settings_come_from_json_or_commas_in_the_environment(monkeypatch):
    monkeypatch.setenv("SIDECAR_ROUTE", '["a.test=http://127.0.0.1:1", "b.test=http://h:2"]')
    monkeypatch.setenv("SIDECAR_RULES", "rules/a.yaml, rules/b.yaml")
    settings = config.load({})
    assert settings.route == ["a.test=http://127.0.0.1:1", "b.test=http://h:2"]
    assert [str(p) for p in settings.rules] == ["rules/a.yaml", "rules/b.yaml"]
    monkeypatch.setenv("SIDECAR_ROUTE", "[not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        config.load({})


@pytest.mark.parametrize("task", ["../../x y\n", "312\n", "a" * 129, ""])
def test_a_task_the_control_api_could_not_name_is_refused(task):
    with pytest.raises(ConfigError, match="task"):
        config.load({"task": task})
