"""A real ``vllm serve`` subprocess for tests: start it on a free loopback port, wait until it
answers ``/health``, stop it with a signal and report how it ended.

- ``free_loopback_port() -> int``: a port on 127.0.0.1 nothing listens on right now.
- ``port_is_listening(port, host="127.0.0.1") -> bool``.
- ``VllmServer(model, extra_args=(), log_path=..., env=None)``: ``start()``,
  ``wait_ready(timeout_s)``, ``base_url``, ``log_tail(lines)``, ``stop(timeout_s) -> int``,
  ``process_tree()`` (the server and every descendant, as psutil processes), ``config_key``
  (the command and extra environment, port aside).
- ``started_server(model, extra_args, log_path, env=None, timeout_s=300) -> VllmServer``:
  started and healthy, or killed with the log tail in the error.
- ``metric_totals(base_url) -> dict``: every ``vllm:`` Prometheus sample summed over its labels.
- ``still_running(processes, timeout_s) -> list``: those of ``processes`` alive after waiting.
- ``launch_ahead(server, config)`` / ``take_ahead(server) -> VllmServer``: a module starts a
  later module's server while its own leave the cores room; the later one takes it (or, if
  none was started ahead, starts its own) and waits for it as usual.

The server's stdout and stderr go to a log file, never to a pipe: an unread pipe fills up and
stalls the server, and on failure the log tail is what explains it.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from specdec_plugin.engine_ports import engine_port_env


def free_loopback_port() -> int:
    # Port 0 lets the kernel pick an unused port; the tiny race until the server binds it is
    # acceptable for tests.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_is_listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def metric_totals(base_url: str) -> dict[str, float]:
    """Every ``vllm:`` sample of ``/metrics`` summed over its labels, by metric name."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^(vllm:[A-Za-z0-9_:]+)(\{[^}]*\})?\s+(\S+)", line)
        if match:
            totals[match.group(1)] = totals.get(match.group(1), 0.0) + float(match.group(3))
    return totals


def still_running(processes: list, timeout_s: float = 10.0) -> list:
    """Those of ``processes`` (psutil) still alive after up to ``timeout_s``. psutil compares
    start times, so a recycled pid does not count as a survivor."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    survivors = []
    for proc in alive:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                survivors.append(proc)
        except psutil.NoSuchProcess:
            continue
    return survivors


class ServerStartError(RuntimeError):
    """The server exited or never became healthy; the message carries the log tail."""


# When the engine core dies during start-up, the API server can stay alive without ever
# answering /health; these log lines mean it will not come up.
FATAL_START_MARKERS = ("EngineDeadError", "Engine core initialization failed")
# A port the server picked (its HTTP port, or one its engine core took for torch.distributed)
# was bound by another process first. Servers start side by side here, so this happens (CI
# simulation, session 35: EADDRINUSE on the engine core's store port); it is not the server's
# fault, and ``wait_ready`` starts it once more on a fresh port.
PORT_TAKEN_MARKERS = ("EADDRINUSE", "address already in use")


class VllmServer:
    def __init__(self, model: str, extra_args: tuple[str, ...] | list[str] = (), *,
                 log_path: str | os.PathLike, env: dict[str, str] | None = None,
                 port: int | None = None) -> None:
        self.model = model
        self.port = port or free_loopback_port()
        self.log_path = Path(log_path)
        self.command = [
            sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model,
            "--dtype", "float32", "--max-model-len", "1024",
            "--host", "127.0.0.1", "--port", str(self.port),
            *extra_args,
        ]
        self.extra_env = dict(env or {})
        # A start of its own for the engine core's rendezvous port (engine_ports.py), so that
        # servers and engines started side by side are not handed the same one.
        self.env = {**os.environ, **engine_port_env(), **self.extra_env}
        self.process: subprocess.Popen | None = None
        self._log_file = None

    @property
    def config_key(self) -> tuple:
        """What this server was started with, its port aside: equal keys, equal servers."""
        command = list(self.command)
        at = command.index("--port")
        del command[at:at + 2]
        return tuple(command), tuple(sorted(self.extra_env.items()))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "VllmServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "wb")
        # A new session, so that a signal meant for the test runner (Ctrl-C) does not also hit
        # the server, and the server's own children can be found by process group if it hangs.
        self.process = subprocess.Popen(
            self.command, stdout=self._log_file, stderr=subprocess.STDOUT, env=self.env,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        return self

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"<no log: {exc}>"
        return "\n".join(text.splitlines()[-lines:])

    def _log_has_fatal_marker(self) -> bool:
        return self._log_has(FATAL_START_MARKERS)

    def wait_ready(self, timeout_s: float = 240.0, poll_s: float = 1.0,
                   port_clash_retries: int = 1) -> None:
        try:
            self._wait_ready_once(timeout_s, poll_s)
        except ServerStartError:
            if port_clash_retries <= 0 or not self._log_has(PORT_TAKEN_MARKERS):
                raise
            self._restart_on_a_fresh_port()
            self.wait_ready(timeout_s, poll_s, port_clash_retries - 1)

    def _log_has(self, markers) -> bool:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return False
        return any(marker in text for marker in markers)

    def _restart_on_a_fresh_port(self) -> None:
        # The whole group, not kill(): the API server has exited, its engine core may not have.
        self._kill_group()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        # The failed start's log is kept beside the new one.
        self.log_path.replace(self.log_path.with_name(self.log_path.name + ".port-clash"))
        self.port = free_loopback_port()
        at = self.command.index("--port")
        self.command[at + 1] = str(self.port)
        self.start()

    def _wait_ready_once(self, timeout_s: float, poll_s: float) -> None:
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise ServerStartError(
                    f"vllm serve exited with code {code} before it was ready; log tail:\n"
                    f"{self.log_tail()}")
            if self._log_has_fatal_marker():
                raise ServerStartError(
                    f"vllm serve's engine died during start-up; log tail:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(poll_s)
        raise ServerStartError(
            f"vllm serve not healthy after {timeout_s:.0f} s; log tail:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 60.0, sig: int = signal.SIGTERM) -> int | None:
        """Send ``sig`` and wait for the exit code. If the server does not exit in time, kill
        its whole process group and return None (the caller asserts on that)."""
        if self.process is None:
            return None
        code = self.process.poll()
        if code is None:
            self.process.send_signal(sig)
            try:
                code = self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                code = None
                self.kill()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return code

    def kill(self) -> None:
        """Last resort: SIGKILL the server's process group (its engine core included)."""
        if self.process is None or self.process.poll() is not None:
            return
        self._kill_group()

    def _kill_group(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)

    def process_tree(self) -> list:
        """The server and all its descendants now (psutil processes): unlike the process group,
        this also finds a child that started a session of its own."""
        import psutil

        if self.process is None or self.process.poll() is not None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def children_alive(self) -> list[int]:
        """Pids still in the server's process group (the engine core runs there too)."""
        if self.process is None:
            return []
        alive = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getpgid(int(entry.name)) == self.process.pid:
                    alive.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
        return alive


# Servers started ahead of the module that uses them, by `config_key`.
_AHEAD: dict[tuple, VllmServer] = {}


def launch_ahead(server: VllmServer, config) -> None:
    """Start ``server`` (built, not started) for a later module, which takes it with
    ``take_ahead``. pytest's ``config`` kills it at the end of the session if none does."""
    if server.config_key not in _AHEAD:
        _AHEAD[server.config_key] = server.start()
        config.add_cleanup(server.kill)


def take_ahead(server: VllmServer) -> VllmServer:
    """The server started ahead with ``server``'s configuration, else ``server`` started now.
    Either is still to be waited for (``wait_ready``)."""
    return _AHEAD.pop(server.config_key, None) or server.start()


def started_server(model: str, extra_args=(), *, log_path: str | os.PathLike,
                   env: dict[str, str] | None = None, timeout_s: float = 300.0) -> VllmServer:
    server = VllmServer(model, extra_args, log_path=log_path, env=env).start()
    try:
        server.wait_ready(timeout_s)
    except BaseException:
        server.kill()
        raise
    return server
