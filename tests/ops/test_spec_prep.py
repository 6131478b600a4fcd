"""Spec-decode input preparation and slot mapping (``ops/spec_prep``): torch reference vs our
Triton kernels vs vLLM 0.26's own Triton kernels (their source compiled by real Triton;
interpreted on CPU), on seeded random inputs, each launched the way vLLM launches it. Every
output buffer starts filled with a sentinel, so whole-buffer equality also checks that the same
elements get written. ``test_vllm_shims_take_vllm_launches`` drives our ``vllm_shims`` with
vLLM's exact launch syntax.

Registry-driven: ``test_provider_matches_reference`` runs every provider the registry lists for
the folder's five ops (Triton's on a GPU: ``gpu``) into buffers with guard elements. Contract:
every provider rejects a request or token count past the buffers it addresses, and an empty
batch writes nothing.
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from specdec_plugin.ops.contract import ContractError  # noqa: E402
from specdec_plugin.ops.spec_prep import reference as ref  # noqa: E402
from specdec_plugin.ops.spec_prep import triton as tri  # noqa: E402
from specdec_plugin.ops.spec_prep.vllm_shims import shim_table  # noqa: E402
from tests.ops.providers import device_for, every_provider, kernel, providers_to_compare  # noqa
from tests.vllm_kernels import load_vllm_kernels  # noqa: E402

FOLDER = "spec_prep"

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SENT = -7


@pytest.fixture(scope="module")
def vk():
    utils = load_vllm_kernels(
        "v1/spec_decode/utils.py",
        ["eagle_step_slot_mapping_metadata_kernel", "eagle_prepare_inputs_padded_kernel",
         "eagle_prepare_next_token_padded_kernel", "copy_and_expand_eagle_inputs_kernel"],
    )
    bt = load_vllm_kernels("v1/worker/block_table.py", ["_compute_slot_mapping_kernel"])
    utils._compute_slot_mapping_kernel = bt._compute_slot_mapping_kernel
    return utils


def poison(shape, dtype):
    shape = (shape,) if isinstance(shape, int) else shape
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype, device=DEV)  # both False and True get written
    return torch.full(shape, SENT, dtype=dtype, device=DEV)


def rand_block_table(g, rows, cols):
    return torch.randperm(rows * cols * 3, generator=g)[: rows * cols].view(rows, cols).to(
        torch.int32).to(DEV)


def packed_queries(g, num_reqs, max_q, min_q=0):
    q_lens = torch.randint(min_q, max_q + 1, (num_reqs,), generator=g)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = q_lens.cumsum(0)
    return q_lens, qsl


def three_ways(run_ref, run_tri, run_vllm, make_buffers):
    results = []
    for run in (run_ref, run_tri, run_vllm):
        bufs = make_buffers()
        run(*bufs)
        results.append([b.cpu() for b in bufs])
    for name, other in (("triton", results[1]), ("vllm", results[2])):
        for i, (a, b) in enumerate(zip(results[0], other)):
            assert torch.equal(a, b), f"buffer {i}: reference != {name}\n{a}\n{b}"
    return results[0]


@pytest.mark.parametrize("layout", ["plain", "hybrid", "dcp"])
def test_compute_slot_mapping(vk, layout):
    g = torch.Generator().manual_seed({"plain": 0, "hybrid": 1, "dcp": 2}[layout])
    kernel_block, per_kv, cp, rank, inter = {
        "plain": (4, 1, 1, 0, 1), "hybrid": (4, 2, 1, 0, 1), "dcp": (4, 1, 2, 1, 2)}[layout]
    kv_block = kernel_block * per_kv
    num_reqs, max_reqs, max_num_tokens = 5, 7, 48
    q_lens, qsl = packed_queries(g, num_reqs, 7)
    num_tokens = int(qsl[-1])
    ctx = torch.randint(0, 30, (num_reqs,), generator=g)
    positions = torch.cat([c + torch.arange(q) for c, q in zip(ctx, q_lens)]).to(DEV)
    table = rand_block_table(g, max_reqs, 16)
    qsl = qsl.to(DEV)
    common = (qsl, positions, table)

    def run_ref(slots):
        ref.compute_slot_mapping(slots, *common, kernel_block, num_reqs, num_tokens,
                                 max_num_tokens, -1, kv_block, per_kv, cp, rank, inter)

    def run_tri(slots):
        tri.compute_slot_mapping(slots, *common, kernel_block, num_reqs, num_tokens,
                                 max_num_tokens, -1, kv_block, per_kv, cp, rank, inter)

    def run_vllm(slots):
        vk._compute_slot_mapping_kernel[(num_reqs + 1,)](
            num_tokens, max_num_tokens, qsl, positions, table, table.stride(0), kernel_block,
            slots, KV_CACHE_BLOCK_SIZE=kv_block, BLOCKS_PER_KV_BLOCK=per_kv,
            TOTAL_CP_WORLD_SIZE=cp, TOTAL_CP_RANK=rank, CP_KV_CACHE_INTERLEAVE_SIZE=inter,
            PAD_ID=-1, BLOCK_SIZE=16,
        )

    (slots,) = three_ways(run_ref, run_tri, run_vllm, lambda: [poison(max_num_tokens, torch.int64)])
    assert (slots != SENT).all()
    assert (slots[:num_tokens] >= 0).any()


def test_compute_slot_mapping_stops_at_num_tokens():
    """Contract edge: the requests' queries reach past ``num_tokens`` (the caller counts fewer
    tokens this step). Every provider writes slots for ``[0, num_tokens)`` and ``pad_id`` for
    ``[num_tokens, max_num_tokens)``, and nothing beyond ``max_num_tokens``."""
    g = torch.Generator().manual_seed(5)
    num_reqs, max_num_tokens, buffer = 4, 12, 20
    qsl = torch.tensor([0, 5, 9, 14, 18], dtype=torch.int32)
    num_tokens = 7  # request 1 is cut after 2 tokens; requests 2 and 3 lie past the end
    positions = torch.arange(18).to(DEV)
    table = rand_block_table(g, num_reqs, 8)
    outs = []
    for impl in (ref.compute_slot_mapping, tri.compute_slot_mapping):
        slots = poison(buffer, torch.int64)
        impl(slots, qsl.to(DEV), positions, table, 4, num_reqs, num_tokens, max_num_tokens)
        outs.append(slots.cpu())
    assert torch.equal(outs[0], outs[1]), f"reference {outs[0]} vs triton {outs[1]}"
    assert (outs[0][:num_tokens] >= 0).all()
    assert (outs[0][num_tokens:max_num_tokens] == -1).all()
    assert (outs[0][max_num_tokens:] == SENT).all()


def test_eagle_step_slot_mapping_metadata(vk):
    g = torch.Generator().manual_seed(3)
    batch, padded, max_model_len, block = 6, 9, 40, 4
    positions = torch.randint(0, max_model_len, (batch,), generator=g)
    positions[:2] = torch.tensor([max_model_len - 1, max_model_len - 2])  # clamping edge
    positions = positions.to(DEV)
    table = rand_block_table(g, batch, 10)
    seq0 = (positions.cpu() + 1).to(torch.int32)

    def buffers():
        return [seq0.clone().to(DEV), poison(batch, torch.int64), poison(padded, torch.int64)]

    def run_ref(seq, pos_out, slots):
        ref.eagle_step_slot_mapping_metadata(positions, table, seq, pos_out, slots, block,
                                             max_model_len, batch, padded)

    def run_tri(seq, pos_out, slots):
        tri.eagle_step_slot_mapping_metadata(positions, table, seq, pos_out, slots, block,
                                             max_model_len, batch, padded)

    def run_vllm(seq, pos_out, slots):
        vk.eagle_step_slot_mapping_metadata_kernel[(padded,)](
            positions, table, table.stride(0), seq, pos_out, slots, block_size=block,
            max_model_len=max_model_len, n_blocks_per_req=table.shape[1], PAD_ID=-1,
            batch_size=batch,
        )

    seq, pos_out, slots = three_ways(run_ref, run_tri, run_vllm, buffers)
    assert (slots != SENT).all() and (pos_out != SENT).all()
    assert slots[0] == -1 and pos_out[0] == 0 and seq[0] == 1


def test_eagle_prepare_inputs_padded(vk):
    g = torch.Generator().manual_seed(4)
    num_reqs = 9
    drafts = torch.randint(0, 4, (num_reqs,), generator=g)
    cu = drafts.cumsum(0).to(torch.int32).to(DEV)
    valid = (torch.randint(0, 5, (num_reqs,), generator=g) % (drafts + 1) + 1).to(torch.int32)
    _, qsl = packed_queries(g, num_reqs, 6, min_q=4)
    valid, qsl = valid.to(DEV), qsl.to(DEV)

    def buffers():
        return [poison(num_reqs, torch.int32), poison(num_reqs, torch.int32)]

    (idx, rej) = three_ways(
        lambda a, b: ref.eagle_prepare_inputs_padded(cu, valid, qsl, a, b, num_reqs),
        lambda a, b: tri.eagle_prepare_inputs_padded(cu, valid, qsl, a, b, num_reqs),
        lambda a, b: vk.eagle_prepare_inputs_padded_kernel[(num_reqs,)](
            cu, valid, qsl, a, b, num_reqs),
        buffers,
    )
    assert (rej >= 0).all() and (rej > 0).any() and (idx != SENT).all()


def test_eagle_prepare_next_token_padded(vk):
    g = torch.Generator().manual_seed(5)
    num_reqs, cols, vocab = 8, 4, 50
    sampled = torch.randint(0, vocab + 10, (num_reqs, cols), generator=g, dtype=torch.int32)
    sampled[torch.rand(num_reqs, cols, generator=g) < 0.4] = -1
    sampled[1] = -1  # nothing valid -> backup token
    sampled = sampled.to(DEV)
    discard = (torch.rand(num_reqs, generator=g) < 0.3).to(DEV)
    backup = torch.randint(0, vocab, (num_reqs,), generator=g, dtype=torch.int32).to(DEV)

    def buffers():
        return [poison(num_reqs, torch.int32), poison(num_reqs, torch.int32)]

    nxt, cnt = three_ways(
        lambda a, b: ref.eagle_prepare_next_token_padded(
            sampled, discard, backup, a, b, vocab, cols, num_reqs),
        lambda a, b: tri.eagle_prepare_next_token_padded(
            sampled, discard, backup, a, b, vocab, cols, num_reqs),
        lambda a, b: vk.eagle_prepare_next_token_padded_kernel[(num_reqs,)](
            sampled, discard, backup, a, b, vocab, cols, num_reqs, sampled.stride(0),
            BLOCK_SIZE_TOKENS=4),
        buffers,
    )
    assert nxt[1] == backup[1].cpu() and cnt[1] == 0
    assert (cnt > 0).any() and (nxt != SENT).all()


@pytest.mark.parametrize("shift", [True, False])
def test_copy_and_expand_eagle_inputs(vk, shift):
    g = torch.Generator().manual_seed(6 + shift)
    num_reqs, P, parallel_id, pad_id = 5, 3, 99, 0
    q_lens, qsl = packed_queries(g, num_reqs, 6, min_q=2)
    total_in = int(qsl[-1])
    rejected = torch.minimum(torch.randint(0, 3, (num_reqs,), generator=g), q_lens - 1)
    qend = (qsl[1:] - 1 - rejected).to(torch.int32)
    tokens = torch.randint(0, 90, (total_in,), generator=g, dtype=torch.int32).to(DEV)
    positions = torch.cat([c + torch.arange(q) for c, q in zip(
        torch.randint(0, 50, (num_reqs,), generator=g), q_lens)]).to(DEV)
    nxt = torch.randint(0, 90, (num_reqs,), generator=g, dtype=torch.int32).to(DEV)
    qsl, qend = qsl.to(DEV), qend.to(DEV)
    n_out = total_in + num_reqs * P + 4

    def buffers():
        return [poison(n_out, torch.int32), poison(n_out, torch.int64), poison(n_out, torch.bool),
                poison(n_out, torch.bool), poison(num_reqs * P, torch.int32),
                poison(total_in, torch.int32)]

    args = lambda b: (tokens, positions, nxt, *b[:6])  # noqa: E731
    tail = (qsl, qend, pad_id, parallel_id, total_in, P, shift)
    block = 8
    grid = (num_reqs, (int(q_lens.max()) + P + block - 1) // block)

    out = three_ways(
        lambda *b: ref.copy_and_expand_eagle_inputs(*args(b), *tail, num_reqs),
        lambda *b: tri.copy_and_expand_eagle_inputs(*args(b), *tail, num_reqs),
        lambda *b: vk.copy_and_expand_eagle_inputs_kernel[grid](
            target_token_ids_ptr=tokens, target_positions_ptr=positions, next_token_ids_ptr=nxt,
            out_input_ids_ptr=b[0], out_positions_ptr=b[1], out_is_rejected_token_mask_ptr=b[2],
            out_is_masked_token_mask_ptr=b[3], out_new_token_indices_ptr=b[4],
            out_hidden_state_mapping_ptr=b[5], query_start_loc_ptr=qsl, query_end_loc_ptr=qend,
            padding_token_id=pad_id, parallel_drafting_token_id=parallel_id,
            total_input_tokens=total_in, num_padding_slots_per_request=P,
            # int, not bool: Triton's interpreter cannot take a Python bool for a runtime arg.
            shift_input_ids=int(shift), BLOCK_SIZE_TOKENS=block),
        buffers,
    )
    written = total_in + num_reqs * (P - 1 if shift else P)
    assert (out[0][:written] != SENT).all() and (out[0][written:] == SENT).all()
    assert (out[4] != SENT).all() and out[3][:written].any() and out[2][:written].any()


@pytest.mark.parametrize("shift", [False, True])
def test_copy_and_expand_eagle_inputs_stays_in_its_buffers(shift):
    """Contract edge: output buffers shorter than the expansion. Every provider writes the same
    prefix and nothing past each buffer's length (views of larger tensors catch a write past)."""
    g = torch.Generator().manual_seed(16 + shift)
    num_reqs, P = 4, 3
    q_lens, qsl = packed_queries(g, num_reqs, 6, min_q=2)
    total_in = int(qsl[-1])
    qend = (qsl[1:] - 1).to(torch.int32).to(DEV)
    tokens = torch.randint(0, 90, (total_in,), generator=g, dtype=torch.int32).to(DEV)
    positions = torch.arange(total_in).to(DEV)
    nxt = torch.randint(0, 90, (num_reqs,), generator=g, dtype=torch.int32).to(DEV)
    short = total_in - 3  # room for fewer outputs than the expansion makes
    outs = []
    for impl in (ref.copy_and_expand_eagle_inputs, tri.copy_and_expand_eagle_inputs):
        full = [poison(total_in + num_reqs * P + 8, dt) for dt in
                (torch.int32, torch.int64, torch.bool, torch.bool)]
        new_idx = poison(num_reqs * P, torch.int32)
        hidden = poison(total_in + 8, torch.int32)
        impl(tokens, positions, nxt, *(t[:short] for t in full), new_idx, hidden[:short - 2],
             qsl.to(DEV), qend, 0, 99, total_in, P, shift, num_reqs)
        for t in full[:2]:
            assert (t[short:] == SENT).all(), f"{impl.__module__} wrote past the output buffer"
        assert (hidden[short - 2:] == SENT).all(), f"{impl.__module__} wrote past the mapping"
        outs.append([t.cpu() for t in full + [new_idx, hidden]])
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_vllm_shims_take_vllm_launches():
    g = torch.Generator().manual_seed(12)
    shims = shim_table(("torch",))
    # block_table.py: grid (num_reqs + 1,), request count recovered from the grid.
    num_reqs, max_num_tokens, block = 3, 20, 4
    q_lens, qsl = packed_queries(g, num_reqs, 5, min_q=1)
    positions = torch.cat([5 + torch.arange(q) for q in q_lens]).to(DEV)
    table = rand_block_table(g, 6, 8)
    qsl = qsl.to(DEV)
    got = poison(max_num_tokens, torch.int64)
    shims[("vllm.v1.worker.block_table", "_compute_slot_mapping_kernel")][(num_reqs + 1,)](
        positions.shape[0], max_num_tokens, qsl, positions, table, table.stride(0), block, got,
        KV_CACHE_BLOCK_SIZE=block, BLOCKS_PER_KV_BLOCK=1, TOTAL_CP_WORLD_SIZE=1,
        TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=1024,
    )
    want = poison(max_num_tokens, torch.int64)
    ref.compute_slot_mapping(want, qsl, positions, table, block, num_reqs, positions.shape[0],
                             max_num_tokens)
    assert torch.equal(got, want) and (got != SENT).all()
    # llm_base_proposer.py launch of the next-token kernel (positional, BLOCK kwarg).
    sampled = torch.tensor([[3, -1, -1], [4, 5, 9], [-1, -1, -1]], dtype=torch.int32, device=DEV)
    nxt, cnt = poison(3, torch.int32), poison(3, torch.int32)
    key = ("vllm.v1.spec_decode.llm_base_proposer", "eagle_prepare_next_token_padded_kernel")
    shims[key][(3,)](sampled, torch.zeros(3, dtype=torch.bool, device=DEV),
                     torch.tensor([7, 7, 7], dtype=torch.int32, device=DEV), nxt, cnt, 50, 3, 3,
                     sampled.stride(0), BLOCK_SIZE_TOKENS=4)
    assert nxt.tolist() == [3, 9, 7] and cnt.tolist() == [1, 3, 0]
    # utils.py launch of the EAGLE step kernel: padded rows come from the grid.
    seq = torch.tensor([4, 8], dtype=torch.int32, device=DEV)
    pos_out, slots = poison(2, torch.int64), poison(4, torch.int64)
    bt = torch.arange(8, dtype=torch.int32, device=DEV).view(2, 4)
    shims[("vllm.v1.spec_decode.utils", "eagle_step_slot_mapping_metadata_kernel")][(4,)](
        torch.tensor([3, 7], device=DEV), bt, bt.stride(0), seq, pos_out, slots, block_size=4,
        max_model_len=100, n_blocks_per_req=4, PAD_ID=-1, batch_size=2,
    )
    assert pos_out.tolist() == [4, 8] and seq.tolist() == [5, 9]
    assert slots.tolist() == [1 * 4 + 0, 6 * 4 + 0, -1, -1]


# ---------------------------------------------------------------------------------------------
# Every registered provider against the reference (the registry decides which run). Each case
# returns its sentinel-filled output buffers, longer than what the op may write: the guard
# elements past its range must keep their poison.

def _poison(n, dtype, device):
    if dtype == torch.bool:
        return torch.ones(n, dtype=dtype, device=device)
    return torch.full((n,), SENT, dtype=dtype, device=device)


def slot_mapping_case(impl, device, seed):
    g = torch.Generator().manual_seed(seed)
    outs = []
    for block, per_kv, cp, rank, inter in ((4, 1, 1, 0, 1), (4, 2, 1, 0, 1), (4, 1, 2, 1, 2)):
        q_lens, qsl = packed_queries(g, 5, 7)
        num_tokens = int(qsl[-1]) - int(q_lens[-1]) // 2  # the last request is cut short
        ctx = torch.randint(0, 30, (5,), generator=g)
        positions = torch.cat([c + torch.arange(q) for c, q in zip(ctx, q_lens)]).to(device)
        slots = _poison(48 + 4, torch.int64, device)  # 4 guard slots past max_num_tokens
        impl(slots, qsl.to(device), positions, rand_block_table(g, 7, 16).to(device), block, 5,
             num_tokens, 48, -1, block * per_kv, per_kv, cp, rank, inter)
        assert (slots[48:] == SENT).all()
        outs.append(slots)
    return outs


def eagle_step_case(impl, device, seed):
    g = torch.Generator().manual_seed(seed)
    batch, padded, max_model_len = 6, 9, 40
    positions = torch.randint(0, max_model_len, (batch,), generator=g)
    positions[:2] = torch.tensor([max_model_len - 1, max_model_len - 2])  # clamping edge
    seq = (positions + 1).to(torch.int32).to(device)
    pos_out, slots = _poison(batch + 2, torch.int64, device), _poison(padded + 2, torch.int64,
                                                                      device)
    impl(positions.to(device), rand_block_table(g, batch, 10).to(device), seq, pos_out, slots, 4,
         max_model_len, batch, padded)
    assert (pos_out[batch:] == SENT).all() and (slots[padded:] == SENT).all()
    return [seq, pos_out, slots]


def prepare_inputs_case(impl, device, seed):
    g = torch.Generator().manual_seed(seed)
    num_reqs = 9
    drafts = torch.randint(0, 4, (num_reqs,), generator=g)
    valid = (torch.randint(0, 5, (num_reqs,), generator=g) % (drafts + 1) + 1).to(torch.int32)
    _, qsl = packed_queries(g, num_reqs, 6, min_q=4)
    idx, rej = _poison(num_reqs + 2, torch.int32, device), _poison(num_reqs + 2, torch.int32,
                                                                   device)
    impl(drafts.cumsum(0).to(torch.int32).to(device), valid.to(device), qsl.to(device), idx, rej,
         num_reqs)
    assert (idx[num_reqs:] == SENT).all() and (rej[num_reqs:] == SENT).all()
    return [idx, rej]


def next_token_case(impl, device, seed):
    g = torch.Generator().manual_seed(seed)
    num_reqs, cols, vocab = 8, 4, 50
    sampled = torch.randint(0, vocab + 10, (num_reqs + 2, cols + 1), generator=g,
                            dtype=torch.int32)
    sampled[torch.rand(num_reqs + 2, cols + 1, generator=g) < 0.4] = -1
    sampled[1] = -1  # nothing valid -> backup token
    discard = torch.rand(num_reqs, generator=g) < 0.3
    backup = torch.randint(0, vocab, (num_reqs,), generator=g, dtype=torch.int32)
    nxt, cnt = _poison(num_reqs + 2, torch.int32, device), _poison(num_reqs + 2, torch.int32,
                                                                   device)
    impl(sampled.to(device), discard.to(device), backup.to(device), nxt, cnt, vocab, cols,
         num_reqs)  # the last sampled column and rows are not the op's to read
    assert (nxt[num_reqs:] == SENT).all() and (cnt[num_reqs:] == SENT).all()
    return [nxt, cnt]


def expand_case(impl, device, seed):
    g = torch.Generator().manual_seed(seed)
    outs = []
    for shift in (True, False):
        num_reqs, P = 5, 3
        q_lens, qsl = packed_queries(g, num_reqs, 6, min_q=2)
        total_in = int(qsl[-1])
        rejected = torch.minimum(torch.randint(0, 3, (num_reqs,), generator=g), q_lens - 1)
        qend = (qsl[1:] - 1 - rejected).to(torch.int32)
        tokens = torch.randint(0, 90, (total_in,), generator=g, dtype=torch.int32)
        positions = torch.cat([c + torch.arange(q) for c, q in zip(
            torch.randint(0, 50, (num_reqs,), generator=g), q_lens)])
        nxt = torch.randint(0, 90, (num_reqs,), generator=g, dtype=torch.int32)
        n_out = total_in + num_reqs * P + 4
        bufs = [_poison(n_out, torch.int32, device), _poison(n_out, torch.int64, device),
                _poison(n_out, torch.bool, device), _poison(n_out, torch.bool, device),
                _poison(num_reqs * P + 2, torch.int32, device),
                _poison(total_in + 2, torch.int32, device)]
        impl(tokens.to(device), positions.to(device), nxt.to(device), *bufs, qsl.to(device),
             qend.to(device), 0, 99, total_in, P, shift, num_reqs)
        written = total_in + num_reqs * (P - 1 if shift else P)
        assert (bufs[0][written:] == SENT).all() and (bufs[4][num_reqs * P:] == SENT).all()
        assert (bufs[5][total_in:] == SENT).all()
        outs += bufs
    return outs


CASES = {"compute_slot_mapping": slot_mapping_case,
         "eagle_step_slot_mapping_metadata": eagle_step_case,
         "eagle_prepare_inputs_padded": prepare_inputs_case,
         "eagle_prepare_next_token_padded": next_token_case,
         "copy_and_expand_eagle_inputs": expand_case}


@pytest.mark.parametrize("op,provider", providers_to_compare(FOLDER))
@pytest.mark.parametrize("seed", [31, 32, 33])
def test_provider_matches_reference(op, provider, seed):
    device = device_for(provider)
    got = CASES[op](kernel(op, provider), device, seed)
    want = CASES[op](kernel(op, "torch"), device, seed)
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=0, atol=0, msg=f"buffer {i}")
    # Non-vacuous: something was written (each case checks its guard elements kept their
    # poison, for the reference and the provider alike).
    assert any((w != SENT).any() for w in want if w.dtype != torch.bool)


# ---------------------------------------------------------------------------------------------
# The contract's edges, for every provider (the reference included): a count past the buffers
# it addresses is rejected before anything is written; an empty batch writes nothing.

def _int32(n, device, fill=SENT):
    return torch.full((n,), fill, dtype=torch.int32, device=device)


def _calls(op, device, num_reqs):
    """A call of ``op`` over ``num_reqs`` requests into buffers sized for 3, and its outputs."""
    d = device
    table = torch.zeros(3, 4, dtype=torch.int32, device=d)
    qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32, device=d)
    outs = [_int32(3, d), _int32(3, d)]
    slots64 = torch.full((3,), SENT, dtype=torch.int64, device=d)
    args = {
        "compute_slot_mapping": lambda: (slots64, qsl, torch.arange(3, device=d), table, 4,
                                         num_reqs, min(num_reqs, 3), 3),
        "eagle_step_slot_mapping_metadata": lambda: (
            torch.arange(3, device=d), table, _int32(3, d, 1), slots64, outs[0].long(), 4, 40,
            num_reqs, num_reqs),
        "eagle_prepare_inputs_padded": lambda: (_int32(3, d, 0), _int32(3, d, 1), qsl, *outs,
                                                num_reqs),
        "eagle_prepare_next_token_padded": lambda: (
            torch.zeros(3, 2, dtype=torch.int32, device=d), torch.zeros(3, dtype=torch.bool,
                                                                        device=d),
            _int32(3, d, 0), *outs, 50, 2, num_reqs),
        "copy_and_expand_eagle_inputs": lambda: (
            _int32(3, d, 1), torch.arange(3, device=d), _int32(3, d, 1), _int32(12, d),
            torch.zeros(12, dtype=torch.int64, device=d), torch.zeros(12, dtype=torch.bool,
                                                                      device=d),
            torch.zeros(12, dtype=torch.bool, device=d), outs[0], outs[1], qsl,
            _int32(3, d, 0), 0, 99, 3, 1, True, num_reqs),
    }[op]()
    return args, [slots64, *outs]


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_contract_rejects_counts_past_the_buffers(op, provider):
    args, outs = _calls(op, device_for(provider), num_reqs=4)
    with pytest.raises(ContractError, match="rows"):
        kernel(op, provider)(*args)
    assert all((o == SENT).all() for o in outs)


@pytest.mark.parametrize("op,provider", every_provider(FOLDER))
def test_empty_batch_writes_nothing(op, provider):
    args, outs = _calls(op, device_for(provider), num_reqs=0)
    if op == "compute_slot_mapping":  # its padding tail is the op's to write: none here
        args = (*args[:6], 0, 0)
    kernel(op, provider)(*args)
    assert all((o == SENT).all() for o in outs)
