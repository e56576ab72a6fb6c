"""The peers benchmark's pure parts: the policy read from config.pbtxt, the HTTP bodies, the answer check, the
venv stamps and the tables. The peers themselves run in `make bench-peers` (their venvs need downloads)."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest
from aiohttp import web

from bench import REPOSITORY
from bench.load.http import HttpTarget, encode, named_raw
from bench.load.targets import VerificationError
from bench.peers import peer_servers, servers, venvs
from bench.peers.common import decode_named
from bench.peers.servers import check_answers, sample_images
from bench.report import notes, servers_table, value_range


def test_the_policy_is_the_models_own_config(tmp_path):
    (tmp_path / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 500 }\n'
        "instance_group [ { kind: KIND_CPU, count: 3 } ]\n"
        'parameters { key: "intra_op_thread_count" value: { string_value: "2" } }\n'
    )
    policy = servers.Policy.of(tmp_path, cores=2)
    assert (policy.max_batch_size, policy.triton_instances, policy.triton_delay_ms, policy.workers) == (8, 3, 0.5, 2)
    assert policy.triton_threads == 2
    (tmp_path / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 4\n')
    assert servers.Policy.of(tmp_path, cores=2).triton_instances == 1


def test_every_peer_has_a_setup_a_description_and_its_requirements(tmp_path):
    policy = servers.Policy(16, 3, 0.0, 2, triton_threads=2)
    for name in peer_servers.PEERS:
        peer = peer_servers.peer(name, "m", tmp_path / "model.onnx", policy, tmp_path)
        assert peer.description and venvs.requirements(name).exists()
        pins = [line for line in venvs.requirements(name).read_text().splitlines() if line and line[0] != "#"]
        assert pins and all("==" in line for line in pins), name  # every requirement pinned
        command = peer.command(venvs.python_of(name), list(range(9000, 9000 + 1 + len(peer.extra_ports))))
        assert command[1:3] == ["-m", f"bench.peers.{name}.server"] and "--port" in command
    pytriton = peer_servers.peer("pytriton", "m", tmp_path / "model.onnx", policy, tmp_path)
    assert pytriton.workers == 3 and pytriton.threads == 2 and pytriton.interpreter == peer_servers.PYTRITON_PYTHON
    assert "3 instances x 2 thread(s)" in pytriton.description
    with pytest.raises(ValueError, match="unknown peer"):
        peer_servers.peer("torchserve", "m", tmp_path / "model.onnx", policy, tmp_path)


def test_a_venv_is_rebuilt_when_its_requirements_or_interpreter_change(tmp_path, monkeypatch):
    monkeypatch.setattr(venvs, "PEERS", tmp_path)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "requirements.txt").write_text("a==1\n")
    first = venvs.stamp("p", "python3.11")
    assert venvs.stamp("p", "/usr/bin/python3.11") != first
    (tmp_path / "p" / "requirements.txt").write_text("a==2\n")
    assert venvs.stamp("p", "python3.11") != first


def test_an_image_batch_travels_as_raw_float32_bytes_with_its_shape():
    images = np.random.default_rng(0).standard_normal((2, 3, 4, 4), dtype=np.float32)
    body, headers = encode(images)
    assert headers["x-shape"] == "2,3,4,4" and body == images.tobytes()
    sent = {"input_ids": np.array([[7, 8]], np.int64), "attention_mask": np.ones((1, 2), np.int64)}
    assert encode(sent) == named_raw(sent)


def serve_answers(answer) -> tuple[web.AppRunner, str]:
    async def start():
        async def predict(request: web.Request) -> web.Response:
            images = np.frombuffer(await request.read(), "<f4")
            return web.Response(body=answer(images).astype("<f4").tobytes())

        app = web.Application(client_max_size=1 << 24)
        app.router.add_post("/predict", predict)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"

    return start


def checked(answer, expected_of) -> None:
    """check_answers on an HttpTarget against a server answering `answer(images)`."""
    images = sample_images(3)
    expected = [expected_of(image) for image in images]

    async def scenario():
        runner, url = await serve_answers(answer)()
        try:
            target = HttpTarget(url, 1, images=images, expected=expected)
            await asyncio.get_running_loop().run_in_executor(None, check_answers, target, len(images))
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def first_thousand(images: np.ndarray) -> np.ndarray:
    return images.ravel()[:1000]


def test_check_answers_passes_right_answers_and_stops_wrong_ones():
    checked(first_thousand, first_thousand)
    with pytest.raises(VerificationError, match="3 of them unlike in-process"):
        checked(lambda images: first_thousand(images) + 1, first_thousand)


def test_value_ranges_and_the_servers_table():
    assert value_range([]) == "n/a" and value_range([3.04]) == "3" and value_range([331.6, 378.9]) == "332-379"
    assert value_range([1.0, 1.04], 1) == "1.0"
    a_rounds = [
        {"points": [point(16, 325.0), point(1, 100.0, 4.0)]},
        {"points": [point(16, 390.0), point(1, 90.0, 4.4)]},
    ]
    lines = servers_table([600.0, 700.0], {"A": {"setup": "s", "rounds": a_rounds}, "B": {"setup": "t", "rounds": []}})
    assert lines[2].startswith("| limit: in-process ONNX Runtime | 600-700 | 1.00x |")
    assert lines[3] == "| A | 325-390 | 0.50-0.60x | 4.0-4.4 | s |"
    assert lines[4] == "| B | n/a | n/a | n/a | t |"


def point(concurrency: int, images_per_s: float, p50_ms: float = 5.0, **extra) -> dict:
    return {"concurrency": concurrency, "images_per_s": images_per_s, "p50_ms": p50_ms, "errors": {}, **extra}


UNSPREAD = {"worker_cpu": {"shares": [0.95, 0.05], "spread": False, "runs": 2, "cpu_seconds": [1.9, 0.1]}}
SPREAD = {"worker_cpu": {"shares": [0.5, 0.5], "spread": True, "runs": 1, "cpu_seconds": [1.0, 1.0]}}


def test_peer_rows_leave_out_unspread_runs_and_runs_with_errors_and_notes_say_why():
    servers_ = {
        "FastAPI 2x1": {
            "setup": "s",
            "rounds": [
                {"points": [point(16, 400.0, **SPREAD), point(1, 200.0, 4.0)]},
                {"points": [point(16, 190.0, **UNSPREAD), point(1, 210.0, 4.2)]},
            ],
        },
        "Ray Serve": {
            "setup": "t",
            "rounds": [
                {"error": "did not start"},
                {"points": [{**point(16, 99.0), "errors": {"503": 2}}, point(16, 120.0)]},
            ],
        },
    }
    table = servers_table([800.0], servers_)
    assert "| FastAPI 2x1 | 400 | 0.50x | 4.0-4.2 | s |" in table  # the unspread run's 190 left out
    assert "| Ray Serve | 120 | 0.15x | n/a | t |" in table  # the run with errors left out
    text = "\n".join(notes(servers_))
    assert "- Ray Serve, round 1: did not start" in text
    assert "- FastAPI 2x1, round 2, c=16: 95% / 5% (not spread: not counted)" in text
    assert "- FastAPI 2x1, round 1, c=16: 50% / 50%\n" in text


def test_a_latency_bound_splits_the_objective_between_the_queue_and_one_batch(tmp_path):
    bound = servers.LatencyBound.for_objective(objective_ms=193.0, single_ms=38.5, max_batch_size=16)
    assert (bound.queue_timeout_ms, bound.max_batch_size) == (96.5, 2)  # two images run in about half of it
    assert servers.LatencyBound.for_objective(25.0, 0.2, 8).max_batch_size == 8  # never above the model's own
    assert servers.LatencyBound.for_objective(25.0, 40.0, 8).max_batch_size == 1
    server = servers.Tritonnx(REPOSITORY, "resnet50", tmp_path, bound=bound)
    config = (server._served_repository() / "resnet50" / "config.pbtxt").read_text()
    # The demo's plain batcher gets a queue policy with the timeout; a policy the config has is rewritten.
    assert re.findall(r"default_timeout_microseconds:\s*(\d+)", config) == ["96500"]
    assert "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 96500" in config
    with_policy = (
        "max_batch_size: 8\ndynamic_batching {\n  default_queue_policy { default_timeout_microseconds: 1 }\n}\n"
    )
    assert bound.apply(with_policy).count("default_timeout_microseconds: 96500") == 1
    assert re.findall(r"(?m)^max_batch_size:\s*(\d+)", config) == ["2"]
    assert server.name == "tritonnx, Triton direct, queue timeout 96 ms, batches <= 2"
    plain = servers.Tritonnx(REPOSITORY, "resnet50", tmp_path)
    assert plain._served_repository() == REPOSITORY and plain.name == "tritonnx, Triton direct"


def test_a_layout_rewrites_instances_and_threads_for_one_path(tmp_path):
    layout = servers.Layout.parse("1x1")
    assert layout == servers.Layout(1, 1) and servers.Layout.parse(" 3x2 ") == servers.Layout(3, 2)
    for wrong in ("1", "0x1", "1x", "axb", "1x1x1"):
        with pytest.raises(ValueError, match="INSTANCESxTHREADS"):
            servers.Layout.parse(wrong)
    facade = servers.Tritonnx(REPOSITORY, "mobilenet_v3_small", tmp_path, facade=True, layout=layout)
    served = facade._served_repository()
    assert served != REPOSITORY and facade.name == "tritonnx facade"  # the goals still name it
    config = (served / "mobilenet_v3_small" / "config.pbtxt").read_text()
    assert re.findall(r"count:\s*(\d+)", config) == ["1"]
    assert re.findall(r'"intra_op_thread_count" value: \{ string_value: "(\d+)"', config) == ["1"]
    assert "1 instance x 1 intra-op thread in place of the config's" in facade.description
    assert servers.Layout(2, 2).describe() == "2 instances x 2 intra-op threads"
    with pytest.raises(ValueError, match="no field"):
        servers.Layout(2, 1).apply("max_batch_size: 8\n")


def test_named_inputs_decode_as_the_load_side_encodes_them_and_misfits_are_refused():
    sent = {"input_ids": np.array([[3, 1, 4]], np.int64), "attention_mask": np.ones((1, 3), np.int64)}
    body, headers = named_raw(sent)
    got = decode_named(headers["x-inputs"], body)
    assert list(got) == list(sent) and all(np.array_equal(got[n], sent[n]) and got[n].dtype == np.int64 for n in sent)
    with pytest.raises(ValueError, match="accounts for 48 bytes, the body has 56"):
        decode_named(headers["x-inputs"], body + b"12345678")
    with pytest.raises(ValueError, match="name:DATATYPE"):
        decode_named("input_ids:INT64", body)


def test_requests_of_the_same_shapes_share_a_batch_and_each_gets_its_own_rows():
    from bench.peers.common import run_grouped

    class Echo:  # the first output is the input, as a batch: which rows ran together is recorded
        batches: list[tuple[int, ...]] = []

        def run(self, outputs, feed):
            Echo.batches.append(feed["x"].shape)
            return [feed["x"] * 10]

    feeds = [{"x": np.full((1, length), index)} for index, length in enumerate([2, 3, 2, 3, 2])]
    outputs = run_grouped(Echo(), feeds)  # type: ignore[arg-type]
    assert [out.tolist() for out in outputs] == [[[10 * i] * n] for i, n in enumerate([2, 3, 2, 3, 2])]
    assert sorted(Echo.batches) == [(2, 3), (3, 2)]  # one batch per sequence length
