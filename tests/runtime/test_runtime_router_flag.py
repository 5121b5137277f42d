"""`fluidpd serve --router`: checked against the policy before any worker starts."""

from __future__ import annotations

import pytest

from fluidpd.cli import build_parser
from fluidpd.cli.serve import configs


def _runtime(*argv: str):
    return configs(build_parser().parse_args(["serve", *argv]))[1]


def test_a_router_is_checked_against_its_policy():
    assert _runtime("--workers", "4", "--router", "sglang-cache-aware").scheduling.router == "sglang-cache-aware"
    assert _runtime("--workers", "4", "--policy", "fluidpd", "--router", "kv-affinity").policy == "fluidpd"
    with pytest.raises(ValueError, match="unknown router 'nope'"):
        _runtime("--workers", "4", "--router", "nope")
    with pytest.raises(ValueError, match="unknown router 'kv-affinity'"):  # fluidpd's own
        _runtime("--workers", "4", "--policy", "static-pd", "--router", "kv-affinity")
