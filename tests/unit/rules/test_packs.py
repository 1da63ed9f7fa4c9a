"""The rule packs shipped in rules/: each loads on its own and says what each rule is for."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.rules import EffectKind, HttpRequestFacts, load_rules
from sidecar.rules.packs import default_rule_paths

PACKS = Path(__file__).resolve().parents[3] / "rules"
FILES = sorted(PACKS.glob("*.y*ml"))


def test_the_packs_are_there():
    names = {path.name for path in FILES}
    assert {
        "idempotency-key.yaml",
        "llm-cache.yaml",
        "generic.yaml",
        "github.yaml",
        "postgres.yaml",
        "webhooks.yaml",
    } <= names


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.name)
def test_every_pack_loads_and_every_rule_has_a_description(path):
    rules = load_rules([path])
    assert len(rules) > 0
    for rule in rules:
        assert rule.description, f"{path.name}: rule {rule.name} has no description"


def test_all_packs_load_together():
    assert len(load_rules([PACKS])) == sum(len(load_rules([path])) for path in FILES)


def match(rules, method, url, headers=(), body=None):
    facts = HttpRequestFacts.from_url(method, url, headers, body)
    found = rules.match(facts)
    return found, facts


def test_stripe_writes_are_keyed_by_request_not_by_the_clients_random_key():
    rules = load_rules([PACKS / "idempotency-key.yaml"])
    url = "https://api.stripe.com/v1/payment_intents"
    one, first = match(rules, "POST", url, {"Idempotency-Key": "uuid-1"}, b"amount=100")
    _, retry = match(rules, "POST", url, {"Idempotency-Key": "uuid-2"}, b"amount=100")
    assert one.rule.name == "stripe.write"
    assert one.rule.idempotency_header == "Idempotency-Key"
    assert one.key(first) == one.key(retry)
    assert match(rules, "GET", url)[0].rule.effect is EffectKind.READ
    assert match(rules, "DELETE", url + "/pi_1")[0].rule.effect is EffectKind.IDEMPOTENT


def test_the_spec_example_charge_is_keyed_by_the_order_header():
    rules = load_rules([PACKS / "idempotency-key.yaml"])
    url = "https://api.example-payments.com/v1/charges"
    found, facts = match(rules, "POST", url, {"X-Order-Id": "ord-312"}, b'{"amount": 1}')
    assert found.key(facts) == "ord-312"


def test_llm_calls_are_cached_by_a_hash_of_the_request():
    rules = load_rules([PACKS / "llm-cache.yaml"])
    for url in (
        "https://api.openai.com/v1/chat/completions",
        "https://api.openai.com/v1/responses",
        "https://api.anthropic.com/v1/messages",
    ):
        found, facts = match(rules, "POST", url, body=b'{"model": "m", "messages": []}')
        assert found.rule.effect is EffectKind.CACHE
        assert found.rule.timeout_s == 300
        _, reordered = match(rules, "POST", url, body=b'{"messages": [], "model": "m"}')
        assert found.key(facts) == found.key(reordered)


def test_generic_notifications_are_non_idempotent_and_block_when_unknown():
    rules = load_rules([PACKS / "generic.yaml"])
    for url in (
        "https://slack.com/api/chat.postMessage",
        "https://events.pagerduty.com/v2/enqueue",
        "https://api.sendgrid.com/v3/mail/send",
        "https://api.twilio.com/2010-04-01/Accounts/AC123/Messages.json",
    ):
        found, _ = match(rules, "POST", url)
        assert found.rule.effect is EffectKind.NON_IDEMPOTENT, url
        assert found.rule.on_unknown == "block"
    event = b'{"event_action": "trigger", "dedup_key": "disk/312", "routing_key": "secret"}'
    found, facts = match(rules, "POST", "https://events.pagerduty.com/v2/enqueue", body=event)
    assert found.key(facts) == "pagerduty:trigger:disk/312"
    read, _ = match(rules, "GET", "https://api.twilio.com/2010-04-01/Accounts/AC1/Messages.json")
    assert read.rule.effect is EffectKind.READ


@pytest.mark.parametrize(
    ("url", "rule", "secret"),
    [
        (
            "https://hooks.slack.com/services/T0001/B0001/XXXXsecretXXXX",
            "slack.webhook.post",
            "XXXXsecretXXXX",
        ),
        (
            "https://discord.com/api/webhooks/1234/tok-XXXXsecret",
            "discord.webhook.execute",
            "tok-XXXXsecret",
        ),
        (
            "https://discord.com/api/v10/webhooks/1234/tok-XXXXsecret",
            "discord.webhook.execute.versioned",
            "tok-XXXXsecret",
        ),
        (
            "https://api.telegram.org/bot123:AAXXXXsecret/sendMessage",
            "telegram.bot.send",
            "123:AAXXXXsecret",
        ),
    ],
)
def test_webhook_urls_carry_secrets_that_the_packs_mark(url, rule, secret):
    rules = load_rules([PACKS / "webhooks.yaml"])
    found, facts = match(rules, "POST", url, body=b'{"text": "deployed"}')
    assert found.rule.name == rule
    assert found.rule.effect is EffectKind.NON_IDEMPOTENT
    assert found.rule.on_unknown == "block"
    assert found.secrets == (secret,)
    assert "XXXX" not in found.key(facts)


def test_telegram_reads_are_not_effects():
    rules = load_rules([PACKS / "webhooks.yaml"])
    for method in ("getUpdates", "getMe"):
        assert match(rules, "POST", f"https://api.telegram.org/bot1:A/{method}")[0] is None
    sent, _ = match(rules, "GET", "https://api.telegram.org/bot1:A/sendPhoto?chat_id=1")
    assert sent.rule.name == "telegram.bot.send"


def test_the_webhook_pack_loads_by_default():
    assert PACKS / "webhooks.yaml" in default_rule_paths()
