"""The facade as a child process (tritonnx/server/facade.py): it binds port 0 and reports the ports it got.

No tritonserver: the facade starts without one (its health says 503), which is all the port reporting needs.
"""

import pytest

from tritonnx.server.facade import FacadeProcess
from tritonnx.server.process import ServerError

NO_TRITON = "127.0.0.1:1"  # refused at once: nothing listens on port 1 of loopback


def test_a_facade_on_port_0_reports_the_ports_it_bound_and_answers_there(tmp_path):
    facade = FacadeProcess(triton_url=NO_TRITON, log_file=tmp_path / "facade.log")
    facade.start()
    try:
        facade.wait_listening(timeout=60)
        assert facade.grpc_port > 0 and facade.http_port > 0 and facade.grpc_port != facade.http_port
        status, report = facade.health()  # on the reported port; no Triton behind it, so not serving
        assert status == 503 and report["status"] == "NOT_SERVING"
        assert f"ports written to {facade.port_file}" in (tmp_path / "facade.log").read_text()
    finally:
        assert facade.stop() == 0
    assert facade.port_file is not None and not facade.port_file.parent.exists()  # its folder goes with it


def test_a_facade_that_exits_before_reporting_its_ports_fails_the_wait_with_its_log(tmp_path):
    facade = FacadeProcess(
        triton_url=NO_TRITON, log_file=tmp_path / "facade.log", extra_args=["--tls-cert", str(tmp_path / "none")]
    )
    facade.start()
    try:
        with pytest.raises(ServerError, match="(?s)exited with code 1 before it was ready.*cannot read the TLS key"):
            facade.wait_listening(timeout=60)
    finally:
        facade.stop()
