"""The attack campaign of `make chaos` (bench/attacks), quick, against a stack of its own, without a token and with
one the attackers hold: every attack is sent and every call ends with a documented status while the probe is
answered, and the report and results.json hold every attack. How fast the calls were answered, the probe's latency
and the facade's memory are gates: printed here, enforced under --gates (at --probe-slack-ms if given: CI's step),
and `make chaos` runs the full campaign, which judges them itself."""

from __future__ import annotations

import json

import pytest

from bench.attacks.__main__ import main
from bench.attacks.abuse import NAMES
from bench.attacks.report import DOCUMENTED
from bench.attacks.watch import KINDS
from tests.helpers import judged


@pytest.mark.parametrize("token", [False, True], ids=["no-token", "token"])
def test_the_quick_campaign_sends_every_attack_and_every_call_gets_a_documented_status(tmp_path, gate, token, request):
    slack = request.config.getoption("--probe-slack-ms")
    code = main(
        [
            "--quick",
            "--out",
            str(tmp_path),
            *(["--token"] if token else []),
            *(["--probe-slack-ms", str(slack)] if slack is not None else []),
        ]
    )

    judged(tmp_path, code, ["| attack | sent | statuses |"])
    results = json.loads((tmp_path / "results.json").read_text())
    report = (tmp_path / "report.md").read_text()
    assert not results["exited"], f"a facade exited during {results['exited']}"
    assert [attack["name"] for attack in results["attacks"]] == NAMES
    for attack in results["attacks"]:
        assert f"`{attack['name']}`" in report
        assert attack["count"] > 0, attack["name"]
        codes = {call["code"] for call in attack["calls"]}
        assert codes, f"{attack['name']}: no call ended"
        assert codes <= DOCUMENTED, f"{attack['name']}: {sorted(codes - DOCUMENTED)}"
        for kind in KINDS:
            assert attack["probe"][kind]["calls"], f"no {kind} probe call during {attack['name']}"
    for kind in KINDS:
        baseline = results["baseline"][kind]
        assert baseline["calls"] > baseline["failed"], f"the {kind} probe got no answer before the attacks"
    for judged_gate in results["gates"]:
        gate(judged_gate["passed"], f"{judged_gate['name']}: {judged_gate['detail']}")
