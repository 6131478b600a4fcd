"""VllmServer.wait_ready starts a server once more, on a fresh port, when its start failed
because a port it picked was taken first (servers start side by side in these tests; CI
simulation, session 35). Any other failure is reported at once. A stand-in script plays the
server: no engine is started."""
from __future__ import annotations

import sys

import pytest

from tests.serve_utils import ServerStartError, VllmServer

STAND_IN = r'''
import http.server, pathlib, sys
marker, outcome = pathlib.Path(sys.argv[1]), sys.argv[2]
port = int(sys.argv[sys.argv.index("--port") + 1])
if not marker.exists():
    marker.write_text("first start")
    print(outcome, flush=True)
    sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


def _server(tmp_path, first_start_prints: str) -> VllmServer:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    srv = VllmServer("unused", log_path=tmp_path / "server.log")
    srv.command = [sys.executable, str(script), str(tmp_path / "started"), first_start_prints,
                   "--port", str(srv.port)]
    return srv.start()


def test_a_port_taken_at_start_is_retried_on_a_fresh_port(tmp_path):
    srv = _server(tmp_path, "torch.distributed.DistNetworkError: port: 37971, code: -98, "
                            "name: EADDRINUSE, message: address already in use")
    first_port = srv.port
    try:
        srv.wait_ready(timeout_s=30, poll_s=0.1)
        assert srv.port != first_port
        assert "EADDRINUSE" in (tmp_path / "server.log.port-clash").read_text()
    finally:
        assert srv.stop(timeout_s=10) is not None


def test_any_other_start_failure_is_reported_at_once(tmp_path):
    srv = _server(tmp_path, "ValueError: no such model")
    with pytest.raises(ServerStartError, match="exited with code 1"):
        srv.wait_ready(timeout_s=30, poll_s=0.1)
    assert not (tmp_path / "server.log.port-clash").exists()
    srv.stop(timeout_s=10)
