"""Suffix decoding under async scheduling (SPECDEC_SUFFIX_ASYNC), the pieces without an engine:
the lazy proposer drafts what the synchronous one drafts on the same steps, the runner's
device-side accepted counts, and when the config turns async scheduling on.

The engine test (greedy output, drafts against each request's own history) is
tests/test_suffix_async_engine.py; the GPU run is tests/gpu/test_suffix_async_gpu.py.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

K = 4
MAX_MODEL_LEN = 200
VOCAB = 50


class _Landed:
    """A copy that has landed (or has not yet: ``query`` False until ``synchronize``)."""

    def __init__(self, landed: bool = True):
        self.landed = landed
        self.waited = False

    def query(self) -> bool:
        return self.landed

    def synchronize(self) -> None:
        self.waited = self.landed = True


def _proposer(max_cached_requests: int):
    from specdec_plugin.spec_decode.suffix import SpecDecSuffixProposer

    spec = SimpleNamespace(num_speculative_tokens=K, suffix_decoding_max_tree_depth=8,
                           suffix_decoding_max_spec_factor=1.0,
                           suffix_decoding_min_token_prob=0.1,
                           suffix_decoding_max_cached_requests=max_cached_requests)
    return SpecDecSuffixProposer(SimpleNamespace(
        speculative_config=spec, model_config=SimpleNamespace(max_model_len=MAX_MODEL_LEN)))


class _Batch:
    """The slice of vLLM's InputBatch the synchronous proposer reads."""

    def __init__(self, rows: list[str], prompts: dict, outputs: dict):
        self.req_ids = list(rows)
        self.req_id_to_index = {r: i for i, r in enumerate(rows)}
        self.token_ids_cpu = np.zeros((len(rows), MAX_MODEL_LEN + 8), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(len(rows), dtype=np.int32)
        self.num_prompt_tokens = np.zeros(len(rows), dtype=np.int32)
        for i, r in enumerate(rows):
            seq = prompts[r] + outputs[r]
            self.token_ids_cpu[i, :len(seq)] = seq
            self.num_tokens_no_spec[i] = len(seq)
            self.num_prompt_tokens[i] = len(prompts[r])


def _stream(seed: int, steps: int = 120):
    """Steps of a changing batch: requests join (some prefill over two steps, sampling
    nothing in the first), decode 1..K+1 tokens a step from a small repetitive vocabulary, leave
    (finished, or preempted and back later with their output), and each step asks the next
    for k in 0..K drafts. Yields (rows, sampled per row, k)."""
    rng = random.Random(seed)
    phrases = [[rng.randrange(VOCAB) for _ in range(rng.randint(3, 7))] for _ in range(6)]
    prompts, outputs, waiting, running, prefilling = {}, {}, [], [], set()
    for n in range(12):
        prompts[f"r{n}"] = [t for _ in range(rng.randint(2, 6)) for t in rng.choice(phrases)]
        outputs[f"r{n}"] = []
        waiting.append(f"r{n}")
    for _ in range(steps):
        while waiting and len(running) < 4 and rng.random() < 0.5:
            req = waiting.pop(0)
            running.append(req)
            if not outputs[req] and rng.random() < 0.5:
                prefilling.add(req)  # first chunk: samples nothing
        if not running:
            if not waiting:
                return
            continue
        rng.shuffle(running) if rng.random() < 0.2 else None  # batch reordered
        sampled = []
        for req in running:
            if req in prefilling:
                prefilling.discard(req)
                sampled.append([])
                continue
            phrase = rng.choice(phrases)
            new = phrase[:rng.randint(1, K + 1)]
            room = MAX_MODEL_LEN - len(prompts[req]) - len(outputs[req])
            sampled.append(new[:max(room, 0)])
        yield list(running), sampled, rng.choice([0, 0, 0, 1, K, K])
        for req, new in zip(running, sampled):
            outputs[req].extend(new)
        for req in list(running):
            if len(prompts[req]) + len(outputs[req]) >= MAX_MODEL_LEN or rng.random() < 0.04:
                running.remove(req)  # finished
            elif rng.random() < 0.03:
                running.remove(req)  # preempted: comes back with its output
                waiting.append(req)


@pytest.mark.parametrize("max_cached_requests", [0, 10000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lazy_drafts_equal_the_synchronous_proposers(seed, max_cached_requests):
    from specdec_plugin.spec_decode.suffix_lazy import LazySuffixDrafts

    sync, lazy_proposer = _proposer(max_cached_requests), _proposer(max_cached_requests)
    lazy = LazySuffixDrafts(lazy_proposer, VOCAB)
    prompts, outputs = {}, {}
    compared = drafted = applied_without_wait = 0
    for rows, sampled, k in _stream(seed):
        for req in rows:
            if req not in prompts:
                prompts[req] = next(p for r, p in _stream_prompts(seed) if r == req)
                outputs[req] = []
        before = {r: list(outputs[r]) for r in rows}
        for req, new in zip(rows, sampled):
            outputs[req].extend(new)
        # The synchronous proposer at the end of the step (bookkeeping has run: histories
        # include the step's tokens).
        want = sync.propose(k, _Batch(rows, prompts, outputs), sampled)
        # The lazy one: the step queued (its copy not landed yet), applied later.
        width = max(map(len, sampled), default=0) or 1
        host = torch.full((len(rows), width), -1, dtype=torch.int32)
        for i, new in enumerate(sampled):
            host[i, :len(new)] = torch.tensor(new, dtype=torch.int32)
        invalid = {i for i, new in enumerate(sampled) if not new}
        event = _Landed(landed=False)
        lazy.record(rows, host, event, invalid, k, lambda row, req: (prompts[req], before[req]))
        if k == 0:
            lazy.drain(wait=False)  # a plain next step: nothing waits, nothing applied yet
            assert not event.waited
            event.landed = True  # landed later; the next step's drain applies it
            continue
        got = lazy.drafts({req: k for req in rows})
        assert event.waited
        for row, req in enumerate(rows):
            assert got[req] == want[row][:k], (seed, req, got[req], want[row])
            compared += 1
            drafted += bool(want[row])
        applied_without_wait = lazy.applied_ready
    assert compared > 100 and drafted > 30 and applied_without_wait > 10, (
        compared, drafted, applied_without_wait)


def test_new_requests_tries_are_built_before_the_wait_for_their_step(monkeypatch):
    """The probe after a batch of new requests waits for their prefill's tokens; their tries
    need only the histories the record holds, so they are built first (session 53)."""
    from specdec_plugin.spec_decode.suffix_lazy import LazySuffixDrafts

    rng = random.Random()
    lazy = LazySuffixDrafts(_proposer(0), VOCAB)
    rows = [f"r{n}" for n in range(rng.randint(2, 6))]
    prompts = {r: [rng.randrange(VOCAB) for _ in range(rng.randint(3, 30))] for r in rows}
    sampled = torch.tensor([[rng.randrange(VOCAB)] for _ in rows], dtype=torch.int32)
    event = _Landed(landed=False)
    lazy.record(rows, sampled, event, set(), K, lambda row, req: (prompts[req], []))
    built_while = []
    prepare = type(lazy.index).prepare_requests

    def recorded(index, histories, *args, **kwargs):
        built_while.append(("waited" if event.waited else "in flight", len(histories)))
        return prepare(index, histories, *args, **kwargs)

    monkeypatch.setattr(type(lazy.index), "prepare_requests", recorded)  # a slotted class
    got = lazy.drafts({r: K for r in rows})
    assert event.waited and set(got) == set(rows)
    assert built_while == [("in flight", len(rows))]  # once, before the wait, every new request
    for r in rows:  # each started with its prompt and the step's token
        assert lazy.index.has_request(r)
        assert lazy.last_token(r) == int(sampled[rows.index(r), 0])


def _stream_prompts(seed: int):
    """The prompts ``_stream(seed)`` gives its requests (same generator, same order)."""
    rng = random.Random(seed)
    phrases = [[rng.randrange(VOCAB) for _ in range(rng.randint(3, 7))] for _ in range(6)]
    for n in range(12):
        yield f"r{n}", [t for _ in range(rng.randint(2, 6)) for t in rng.choice(phrases)]


def test_accepted_counts_follow_the_rejection_output():
    from specdec_plugin.spec_decode.suffix_async_runner import accepted_counts

    sampled = torch.tensor([[5, 6, -1, -1], [7, -1, -1, -1], [8, 9, 10, 11], [3, -1, -1, -1]],
                           dtype=torch.int32)
    discard = torch.tensor([False, False, False, True, False])  # row 3 still prefilling
    last, counts = accepted_counts(sampled, discard, vocab_size=100)
    assert counts.tolist() == [2, 1, 4, 0] and counts.dtype == torch.int32
    assert last.tolist()[:3] == [6, 7, 11]


def test_late_draft_slots_are_each_rows_last_tokens_in_batch_order():
    """Late drafts (SPECDEC_SUFFIX_LATE_DRAFTS) go where vLLM's preparation put the draft
    slots: the last len(draft) tokens of each row, rows in batch order; rows without a draft
    (a prefill, a request that reserved nothing) are skipped."""
    from specdec_plugin.spec_decode.suffix_async_runner import late_draft_slots

    rng = random.Random()
    req_ids = [f"r{i}" for i in range(rng.randint(3, 8))]
    counts, drafts = [], {}
    for req_id in req_ids:
        k = rng.randint(0, 4)
        if k:
            drafts[req_id] = [rng.randrange(1, 1000) for _ in range(k)]
        counts.append(1 + k + rng.choice([0, rng.randint(1, 9)]) * (k == 0))
    query_end = np.cumsum(counts)
    positions, tokens = late_draft_slots(req_ids, query_end, drafts)
    flat = np.zeros(int(query_end[-1]), dtype=np.int64)
    flat[positions] = tokens
    want_tokens = []
    for row, req_id in enumerate(req_ids):
        draft = drafts.get(req_id, [])
        end = int(query_end[row])
        assert flat[end - len(draft):end].tolist() == draft
        want_tokens.extend(draft)
    assert tokens == want_tokens and len(set(positions)) == len(positions)


def test_late_drafts_are_the_cuda_default_and_a_user_setting_wins(monkeypatch):
    """Late drafts are on by default on CUDA only (session 58's H200 run), together with the
    uniform draft lengths they need; the CPU keeps drafting before the preparation. The device
    layer's value is a default (``os.environ.setdefault`` in config_defaults.py): a user's
    ``SPECDEC_SUFFIX_LATE_DRAFTS=0`` stays."""
    from specdec_plugin import envs
    from specdec_plugin.config_defaults import apply_process_env
    from specdec_plugin.device.cpu import CpuDevice
    from specdec_plugin.device.cuda import CudaDevice

    for device in (CudaDevice, CpuDevice):
        for name in device.process_env:
            monkeypatch.delenv(name, raising=False)  # restored after the test
    apply_process_env(CpuDevice)
    assert envs.suffix_late_drafts() is False
    apply_process_env(CudaDevice)
    assert envs.suffix_late_drafts() is True and envs.uniform_drafts() is True
    monkeypatch.setenv("SPECDEC_SUFFIX_LATE_DRAFTS", "0")
    apply_process_env(CudaDevice)
    assert envs.suffix_late_drafts() is False


@pytest.mark.parametrize("env,user,want", [
    (None, None, False),  # off by default: vLLM turns it off for suffix
    ("1", None, False),  # vLLM turns it on (P12), the CPU device off (no streams)...
    ("force", None, True),  # ...unless forced (tests)
    ("force", True, True),  # an explicit True is accepted (vLLM raises without P12)
    ("force", False, False),  # the user's explicit "off" wins
])
def test_config_turns_async_scheduling_on_for_suffix_only_where_asked(monkeypatch, smollm2_path,
                                                                      env, user, want):
    from vllm.engine.arg_utils import EngineArgs
    import vllm.config.vllm as vllm_config_module

    if env is None:
        monkeypatch.delenv("SPECDEC_SUFFIX_ASYNC", raising=False)
    else:
        monkeypatch.setenv("SPECDEC_SUFFIX_ASYNC", env)
    vllm_name = vllm_config_module.NgramGPUTypes
    args = EngineArgs(model=smollm2_path, dtype="float32", max_model_len=1024,
                      async_scheduling=user,
                      speculative_config={"method": "suffix", "num_speculative_tokens": K})
    config = args.create_engine_config()
    assert config.scheduler_config.async_scheduling is want
    assert config.scheduler_config.scheduler_cls is None or want == (
        "Async" in config.scheduler_config.scheduler_cls)
    assert vllm_config_module.NgramGPUTypes is vllm_name  # P12 undone after the build


def test_without_the_variable_vllm_still_refuses_explicit_async_suffix(monkeypatch, smollm2_path):
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.delenv("SPECDEC_SUFFIX_ASYNC", raising=False)
    args = EngineArgs(model=smollm2_path, dtype="float32", max_model_len=1024,
                      async_scheduling=True,
                      speculative_config={"method": "suffix", "num_speculative_tokens": K})
    with pytest.raises(ValueError, match="async scheduling is only supported"):
        args.create_engine_config()


def test_unset_variable_takes_the_device_layers_default(monkeypatch, smollm2_path):
    """SPECDEC_SUFFIX_ASYNC unset: the device layer decides (``suffix_async_default``, "1" on
    CUDA GPUs). With a default of "1", vLLM accepts an explicit ``async_scheduling=True`` for
    suffix (P12 in place for the build), which it refuses with the CPU's own "0" (the test
    above); the CPU layer then turns async scheduling off (no streams), as with the variable."""
    from vllm.engine.arg_utils import EngineArgs

    from specdec_plugin import envs
    from specdec_plugin.device.cpu import CpuDevice
    from specdec_plugin.device.cuda import CudaDevice

    assert CudaDevice.suffix_async_default == "1" and CpuDevice.suffix_async_default == "0"
    monkeypatch.delenv("SPECDEC_SUFFIX_ASYNC", raising=False)
    assert envs.suffix_async("1") == "1" and envs.suffix_async() == "0"
    monkeypatch.setenv("SPECDEC_SUFFIX_ASYNC", "0")
    assert envs.suffix_async("1") == "0"  # the user's setting wins over the device's
    monkeypatch.delenv("SPECDEC_SUFFIX_ASYNC")
    monkeypatch.setattr(CpuDevice, "suffix_async_default", "1")
    args = EngineArgs(model=smollm2_path, dtype="float32", max_model_len=1024,
                      async_scheduling=True,
                      speculative_config={"method": "suffix", "num_speculative_tokens": K})
    config = args.create_engine_config()
    assert config.scheduler_config.async_scheduling is False


def test_p12_reaches_processes_that_build_no_config(tmp_path):
    """An engine-core process runs VllmConfig.__post_init__ again on the config it received:
    P12 must be in place there from the platform's import alone (patches/suffix_async_types.py).
    A fresh interpreter resolves the platform (as vLLM does when torch_utils is imported),
    then loads vLLM's config module."""
    import subprocess
    import sys

    code = ("import vllm.utils.torch_utils\n"
            "import vllm.config.vllm as m\n"
            "from typing import get_args\n"
            "print('P12', sorted(get_args(m.NgramGPUTypes)))\n")
    environ = __import__("os").environ
    # Both interpreters at once: each is mostly one-threaded imports, so on 2 cores the pair
    # takes about what one does.
    procs = {value: subprocess.Popen([sys.executable, "-c", code],
                                     env={**environ, "SPECDEC_SUFFIX_ASYNC": value},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for value in ("1", "0")}
    outs = {}
    try:
        for value, proc in procs.items():
            outs[value] = proc.communicate(timeout=300)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stdout, stderr = outs["1"]
    assert "P12 ['ngram_gpu', 'suffix']" in stdout, stdout + stderr[-2000:]
    stdout, stderr = outs["0"]
    assert "P12 ['ngram_gpu']" in stdout, stdout + stderr[-2000:]
