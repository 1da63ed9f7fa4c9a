"""Benchmark: matching a request to the rules, with every shipped pack loaded.

    ./run bench rule_match [--rounds 5] [--calls 20000]

Every request the proxy may have to intercept (its host is named by some rule) is
matched against the rules on the event loop, before its body is read.  For a few
requests to hosts the packs name (a GitHub read, GitHub writes early and late in the
pack, a Stripe write), side by side in one run, microseconds per match (median of
``--rounds`` interleaved rounds, min-max):

* rule by rule - every HTTP rule's conditions in load order, method first, then host
  (``http_match``, as ``RuleSet.match`` did before it kept the rules of each host);
* RuleSet.match - what the proxy runs: the rules whose host patterns take the request's
  host (kept per host and port), then their other conditions.

Both must name the same rule; the benchmark stops if they do not.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from sidecar.rules import HttpRequestFacts, RuleSet
from sidecar.rules.loader import load_rules
from sidecar.rules.matcher import http_match
from sidecar.rules.packs import packs_dir

REQUESTS = (
    ("GET", "api.github.com", "/repos/acme/app/pulls?state=open"),
    ("POST", "api.github.com", "/repos/acme/app/git/refs"),
    ("POST", "api.github.com", "/repos/acme/app/issues/3/labels"),
    ("POST", "api.stripe.com", "/v1/charges"),
)


def rule_by_rule(rules: RuleSet) -> Callable[[HttpRequestFacts], str | None]:
    def match(facts: HttpRequestFacts) -> str | None:
        for rule in rules:
            condition = rule.http
            if condition is None or (condition.method and facts.method not in condition.method):
                continue  # the method first, as RuleSet.match did: cheaper than the host
            if http_match(condition, facts) is not None:
                return rule.name
        return None

    return match


def kept_per_host(rules: RuleSet) -> Callable[[HttpRequestFacts], str | None]:
    def match(facts: HttpRequestFacts) -> str | None:
        found = rules.match(facts)
        return None if found is None else found.rule.name

    return match


def per_call_us(
    match: Callable[[HttpRequestFacts], str | None], facts: HttpRequestFacts, calls: int
) -> float:
    began = time.perf_counter()
    for _ in range(calls):
        match(facts)
    return (time.perf_counter() - began) / calls * 1e6


def main() -> None:
    options = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    options.add_argument("--rounds", type=int, default=5)
    options.add_argument("--calls", type=int, default=20_000, help="matches per row and round")
    args = options.parse_args()
    rules = load_rules([packs_dir()])
    ways = {"rule by rule": rule_by_rule(rules), "RuleSet.match": kept_per_host(rules)}
    print(f"{len(rules)} rules (every pack in {packs_dir()}), {args.calls:,} matches per figure\n")
    print("| request | rule | rule by rule, us | RuleSet.match, us | ratio |")
    print("|---|---|---:|---:|---:|")
    for method, host, target in REQUESTS:
        facts = HttpRequestFacts.from_target(method, host, 443, target)
        named = {way: match(facts) for way, match in ways.items()}
        if len(set(named.values())) != 1:
            raise SystemExit(f"{method} {host}{target}: the two ways disagree: {named}")
        times: dict[str, list[float]] = {way: [] for way in ways}
        for round_ in range(args.rounds):
            order = list(ways) if round_ % 2 == 0 else list(ways)[::-1]
            for way in order:
                times[way].append(per_call_us(ways[way], facts, args.calls))
        slow, fast = (statistics.median(times[way]) for way in ways)
        spread = {way: f"({min(t):.1f}-{max(t):.1f})" for way, t in times.items()}
        print(
            f"| {method} {host}{target} | {named['RuleSet.match']} "
            f"| {slow:.1f} {spread['rule by rule']} | {fast:.1f} {spread['RuleSet.match']} "
            f"| {fast / slow:.2f}x |"
        )


if __name__ == "__main__":
    main()
