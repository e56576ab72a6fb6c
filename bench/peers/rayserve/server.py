"""Ray Serve serving an ONNX file: deployment replicas running ONNX Runtime, batched with @serve.batch.

The setup Ray Serve's docs give for throughput on CPU: a replica of one CPU per core, `@serve.batch` and
`max_ongoing_requests` above the batch size so a replica can gather a batch. The body is the raw float32 bytes, or
named inputs (`x-inputs`, the text models; requests of the same shapes batched together); the answer the first
output's raw float32 bytes. A local Ray of its own on 127.0.0.1; SIGTERM or SIGINT shuts Serve and Ray down.
"""

from __future__ import annotations

import os

# Before Ray is imported, for every Ray process it starts: no usage report, and every component on
# loopback (Ray otherwise takes the address of the interface routing to the internet as the node's,
# even with _node_ip_address). The flag is the one Ray reads for single-node clusters on macOS/Windows.
os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})

import signal  # noqa: E402
import threading  # noqa: E402

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402
from ray.serve.schema import LoggingConfig  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response  # noqa: E402

from bench.peers.common import HOST, arguments, decode_named, run, run_grouped, session  # noqa: E402

READY = "application ready"  # printed once Serve answers; bench.peers.servers waits for it


def deployment(args):  # noqa: ANN001, ANN201 - Ray's deployment types are not public
    @serve.deployment(
        num_replicas=args.workers,
        ray_actor_options={"num_cpus": 1},
        max_ongoing_requests=2 * args.max_batch_size,
        # No line per request: an access log costs every request CPU on the same cores.
        logging_config=LoggingConfig(enable_access_log=False),
    )
    class OnnxDeployment:
        def __init__(self) -> None:
            self.session = session(args.model, args.threads)
            self.shape = [dim if isinstance(dim, int) else -1 for dim in self.session.get_inputs()[0].shape]

        @serve.batch(max_batch_size=args.max_batch_size, batch_wait_timeout_s=args.batch_wait_ms / 1000)
        async def infer(self, images: list[np.ndarray]) -> list[bytes]:
            outputs = run(self.session, np.concatenate(images))
            sizes = np.cumsum([len(image) for image in images])[:-1]
            return [np.ascontiguousarray(part, "<f4").tobytes() for part in np.split(outputs, sizes)]

        @serve.batch(max_batch_size=args.max_batch_size, batch_wait_timeout_s=args.batch_wait_ms / 1000)
        async def infer_named(self, feeds: list[dict[str, np.ndarray]]) -> list[bytes]:
            return [np.ascontiguousarray(out, "<f4").tobytes() for out in run_grouped(self.session, feeds)]

        async def __call__(self, request: Request) -> Response:
            body, named = await request.body(), request.headers.get("x-inputs")
            if named is not None:  # the text models: named inputs of any type (bench.load.http.named_raw)
                try:
                    feed = decode_named(named, body)
                except ValueError as error:
                    return Response(str(error), status_code=400)
                return Response(await self.infer_named(feed), media_type="application/octet-stream")
            images = np.frombuffer(body, "<f4").reshape(self.shape)
            return Response(await self.infer(images), media_type="application/octet-stream")

    return OnnxDeployment


def main(argv: list[str] | None = None) -> None:
    args = arguments(__doc__.splitlines()[0], "python -m bench.peers.rayserve.server").parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    ray.init(address="local", num_cpus=args.workers, include_dashboard=False, _node_ip_address=HOST)
    try:
        serve.start(http_options={"host": HOST, "port": args.port})
        serve.run(deployment(args).bind(), name=args.name, route_prefix="/predict")
        print(READY, flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
