"""Engines started at once from one parent get rendezvous ports of their own
(specdec_plugin/engine_ports.py): CI lost a run to two engines handed the same port."""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from specdec_plugin.engine_ports import (FIRST_PORT, PORTS_PER_ENGINE, SLOTS, engine_port_env,
                                         next_engine_port)


def test_ports_from_many_threads_are_distinct_and_below_the_ephemeral_range():
    with ThreadPoolExecutor(8) as pool:
        ports = list(pool.map(lambda _: next_engine_port(), range(200)))
    assert len(set(ports)) == len(ports)
    # Each engine's start has PORTS_PER_ENGINE ports to itself before the next one's.
    ordered = sorted(ports)
    assert min(b - a for a, b in zip(ordered, ordered[1:])) >= PORTS_PER_ENGINE
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    assert FIRST_PORT <= min(ports) and max(ports) + PORTS_PER_ENGINE <= ephemeral_low
    assert FIRST_PORT + SLOTS * PORTS_PER_ENGINE <= ephemeral_low


def test_vllm_takes_its_rendezvous_port_from_the_env_we_set():
    """The fix rests on vLLM's get_open_port starting at VLLM_PORT and moving past a taken one.
    Asked in a fresh process, as the engines are: once an engine has started in a process,
    vLLM caches its environment variables (``vllm.envs.enable_envs_cache``), so a variable
    set later is not seen there (the CI simulation's test process had engines in it)."""
    env = {**os.environ, **engine_port_env(), "VLLM_PLUGINS": ""}
    port = int(env["VLLM_PORT"])
    # With the port held by another socket vLLM must step past it; once it is free, take it.
    ask = ("import socket; from vllm.utils.network_utils import get_open_port\n"
           f"held = socket.socket(); held.bind(('', {port})); held.listen()\n"
           "print('HELD', get_open_port()); held.close(); print('FREE', get_open_port())\n")
    out = subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, text=True,
                         timeout=300)
    answers = dict(line.split() for line in out.stdout.splitlines()
                   if line.startswith(("HELD ", "FREE ")))
    assert answers == {"HELD": str(port + 1), "FREE": str(port)}, out.stderr[-2000:]
