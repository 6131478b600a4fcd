"""Greedy drafting over EAGLE-3's draft vocabulary (specdec_plugin/spec_decode/draft_vocab.py).

Our proposer's ``_greedy_sample`` must give exactly vLLM's: the argmax of vLLM's own
``compute_logits`` (widened to the target vocabulary). Checked on vLLM's real
``Eagle3LlamaForCausalLM`` with the shipped drafter's weights, fresh random hidden states, a
fresh random increasing draft -> target map and forced ties (duplicated LM-head rows, one pair
across tensor-parallel shards), at tensor parallel 1 and 3 (gloo; the LM head is then split in
three and its logits all-gathered). The engine-level check (greedy output equal to no
speculation, acceptance equal to the goldens) is tests/test_spec_decode_greedy.py[eagle3].
"""
from __future__ import annotations

import ast
import json
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_plugin.spec_decode.draft_vocab import WIDENING_COMPUTE_LOGITS

_ROOT = Path(__file__).resolve().parent.parent

# One rank of the check, in its own process: it initializes torch.distributed, which must not
# leak into the engines other tests start. argv: port, rank, world size, seed.
_RANK_SCRIPT = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
from vllm.config import set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.utils import get_model_architecture
from vllm.v1.spec_decode.eagle import EagleProposer
from specdec_plugin.models import drafters
from specdec_plugin.spec_decode.draft_vocab import local_argmax_applies
from specdec_plugin.spec_decode.graphed_proposers import SpecDecEagleProposer

port, rank, world, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
cfg = EngineArgs(model=str(drafters.target_for("eagle3")), dtype="float32", max_model_len=1024,
                 tensor_parallel_size=world,
                 speculative_config=drafters.speculative_config("eagle3", 3)
                 ).create_engine_config()
draft = cfg.speculative_config.draft_model_config
cls, _ = get_model_architecture(draft)
with set_current_vllm_config(cfg):
    init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                 distributed_init_method="tcp://127.0.0.1:" + port)
    initialize_model_parallel(world, 1)
    model = cls(vllm_config=cfg, prefix="")
tensors = load_file(str(Path(draft.model) / "model.safetensors"))
model.load_weights(iter(tensors.items()))
report = {"shipped_map_applies": local_argmax_applies(model)}

# Every rank draws the same numbers (one seed), as tensor-parallel ranks see the same inputs.
gen = torch.Generator().manual_seed(seed)
draft_vocab, vocab = model.config.draft_vocab_size, model.config.vocab_size
head = tensors["lm_head.weight"].clone()
shard = draft_vocab // world


def pick(lo, hi):
    return int(torch.randint(int(lo), int(hi), (1,), generator=gen))


# Tied rows: equal logits for every hidden state. Four distinct indices: one pair inside the
# first shard, one from the first shard to the last quarter of the vocabulary (at TP=3 the last
# shard: those maxima meet only after the all-gather).
pairs = [(pick(0, shard / 4), pick(shard / 4, shard / 2)),
         (pick(shard / 2, 3 * shard / 4), pick(draft_vocab - shard / 4, draft_vocab))]
for a, b in pairs:
    head[a] *= 4  # a longer row: the hidden states aimed at it below make it the maximum
    head[b] = head[a]
model.load_weights(iter([("lm_head.weight", head)]))
targets = torch.randperm(vocab, generator=gen)[:draft_vocab].sort().values
model.draft_id_to_target_id.copy_(targets - torch.arange(draft_vocab))

# Hidden states: random, plus rows aimed at the tied pairs so that they hold the maximum.
rows = [torch.randn(37, model.config.hidden_size, generator=gen)]
for a, _ in pairs:
    rows.append(head[a].float() + 0.05 * torch.randn(3, head.shape[1], generator=gen))
hidden = torch.cat(rows).to(torch.float32)

proposer = object.__new__(SpecDecEagleProposer)  # the real class; only what sampling reads
proposer.model, proposer.use_local_argmax_reduction = model, False
proposer.use_heterogeneous_vocab = False
proposer._local_draft_argmax = proposer._drafts_argmax_locally()
with torch.inference_mode():
    want = model.compute_logits(hidden).argmax(dim=-1)
    have = proposer._greedy_sample(hidden)
    vllm_path = EagleProposer._greedy_sample(proposer, hidden)
    logits = model.logits_processor(model.lm_head, hidden)
    tied_rows = int(((logits == logits.max(dim=-1, keepdim=True).values).sum(-1) > 1).sum())
    # The same ties under a map that is not increasing (the tied pairs' targets swapped): the
    # full-vocabulary argmax then picks the other token of a pair, so the check must refuse it.
    swapped = targets.clone()
    for a, b in pairs:
        swapped[a], swapped[b] = targets[b], targets[a]
    model.draft_id_to_target_id.copy_(swapped - torch.arange(draft_vocab))
    report["swapped_map_applies"] = local_argmax_applies(model)
    swapped_want = model.compute_logits(hidden).argmax(dim=-1)
    top = logits.argmax(dim=-1)
    swapped_local = top + model.draft_id_to_target_id[top]
report.update(
    rank=rank, local=proposer._local_draft_argmax, rows=int(hidden.shape[0]), tied_rows=tied_rows,
    equal=bool(torch.equal(have, want)), dtype_equal=have.dtype == want.dtype,
    vllm_path_equal=bool(torch.equal(vllm_path, want)),
    swapped_rows_differ=int((swapped_want != swapped_local).sum()),
    in_draft_vocab=bool(torch.isin(have, targets).all()))
print("REPORT " + json.dumps(report), flush=True)
"""


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _class_method(module: str, qualname: str) -> ast.FunctionDef:
    import importlib.util

    path = importlib.util.find_spec(module).origin
    cls_name, fn_name = qualname.split(".")
    for node in ast.walk(ast.parse(Path(path).read_text())):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == fn_name:
                    return item
    raise AssertionError(f"{module}.{qualname} not found in vLLM")


def test_listed_compute_logits_are_one_function():
    # The list names vLLM classes whose compute_logits only widens the draft logits; the model
    # check below runs on Llama's, so the others must still be that same code.
    dumps = {name: ast.dump(_class_method(*name)) for name in WIDENING_COMPUTE_LOGITS}
    llama = dumps[("vllm.model_executor.models.llama_eagle3",
                   "Eagle3LlamaForCausalLM.compute_logits")]
    assert all(d == llama for d in dumps.values()), sorted(n for n, d in dumps.items() if d != llama)
    assert "draft_id_to_target_id" in llama and "new_full" in llama


@pytest.mark.parametrize("world", [1, 3])
def test_greedy_draft_equals_argmax_of_vllm_compute_logits(smollm2_path, world):
    from specdec_plugin.models import drafters

    drafters.drafter_checkpoint("eagle3")  # built here, so the ranks only read it
    seed, port = random.randrange(2**31), _free_port()
    procs = [subprocess.Popen([sys.executable, "-c", _RANK_SCRIPT, port, str(rank), str(world),
                               str(seed)], cwd=_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for rank in range(world)]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        lines = [ln for ln in out.splitlines() if ln.startswith("REPORT ")]
        assert proc.returncode == 0 and lines, f"seed {seed}: {err[-3000:]}"
        reports.append(json.loads(lines[-1][len("REPORT "):]))
    for r in reports:
        msg = f"seed {seed}, TP={world}: {r}"
        # The shipped drafter's map is increasing (training sorts its draft vocabulary).
        assert r["shipped_map_applies"] and r["local"], msg
        assert r["tied_rows"] > 0, msg  # the tie-break really was exercised
        assert r["equal"] and r["dtype_equal"] and r["in_draft_vocab"], msg
        assert r["vllm_path_equal"], msg
        # A map that is not increasing would break ties differently; it is refused.
        assert not r["swapped_map_applies"] and r["swapped_rows_differ"] > 0, msg
