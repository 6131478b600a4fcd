"""attention/impl.py: the per-layer host path. Each layer keeps the (key_cache, value_cache)
views of its KV cache tensor instead of unbinding it twice per step; these tests pin that the
views are always those of the tensor passed now (another tensor, or the same one re-pointed in
place) and that the layer's writes and outputs equal the kernels' on fresh unbind views."""
from __future__ import annotations

import torch

from specdec_plugin.attention.impl import SpecDecAttentionImpl
from specdec_plugin.attention.metadata import SpecDecAttentionMetadata
from specdec_plugin.ops.registry import get_kernel

REQS, HQ, HKV, HEAD, BLOCK, BLOCKS, CONTEXT = 3, 4, 2, 32, 16, 8, 20


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(REQS, HQ + 2 * HKV, HEAD, generator=g)
    table = torch.randperm(BLOCKS, generator=g)[: REQS * 2].view(REQS, 2).to(torch.int32)
    slots = table[:, (CONTEXT - 1) // BLOCK].long() * BLOCK + (CONTEXT - 1) % BLOCK
    meta = SpecDecAttentionMetadata(
        num_actual_tokens=REQS, max_query_len=1, max_seq_len=CONTEXT,
        query_start_loc=torch.arange(REQS + 1, dtype=torch.int32),
        seq_lens=torch.full((REQS,), CONTEXT, dtype=torch.int32), block_table=table,
        slot_mapping=slots)
    return qkv[:, :HQ], qkv[:, HQ: HQ + HKV], qkv[:, HQ + HKV:], meta


def _cache(seed: int, blocks: int = BLOCKS) -> torch.Tensor:
    return torch.randn(2, blocks, BLOCK, HKV, HEAD, generator=torch.Generator().manual_seed(seed))


def _layer_step(impl, kv_cache, q, k, v, meta) -> torch.Tensor:
    out = torch.full_like(q, float("nan"))
    impl.do_kv_cache_update(None, k, v, kv_cache, meta.slot_mapping)
    return impl.forward(None, q, k, v, kv_cache, meta, out)


def _kernels_step(kv_cache, q, k, v, meta) -> torch.Tensor:
    """The same step on fresh unbind views, straight through the kernels."""
    key_cache, value_cache = kv_cache.unbind(0)
    get_kernel("reshape_and_cache")(k, v, key_cache, value_cache, meta.slot_mapping)
    out = torch.full_like(q, float("nan"))
    get_kernel("paged_attention")(q, key_cache, value_cache, meta.block_table,
                                  meta.query_start_loc, meta.seq_lens, HEAD ** -0.5, out,
                                  meta.max_query_len, meta.max_seq_len)
    return out


def _check_step(impl, kv_cache, seed: int) -> None:
    q, k, v, meta = _inputs(seed)
    want_cache = kv_cache.clone()
    want = _kernels_step(want_cache, q, k, v, meta)
    got = _layer_step(impl, kv_cache, q, k, v, meta)
    assert torch.equal(got, want)
    assert torch.equal(kv_cache, want_cache)


def test_views_are_made_once_per_cache_tensor():
    impl, kv_cache = SpecDecAttentionImpl(HQ, HEAD, HEAD ** -0.5, HKV), _cache(0)
    views = impl._kv_views(kv_cache)
    assert impl._kv_views(kv_cache) is views
    for a, b in zip(views, kv_cache.unbind(0)):
        assert a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
    for seed in range(3):  # steps on one cache: the layer's writes and outputs are the kernels'
        _check_step(impl, kv_cache, seed)


def test_another_cache_tensor_gets_its_own_views():
    impl, first, second = SpecDecAttentionImpl(HQ, HEAD, HEAD ** -0.5, HKV), _cache(0), _cache(1)
    _check_step(impl, first, 0)
    untouched = first.clone()
    _check_step(impl, second, 1)  # e.g. a cache reallocated: writes land in the new one
    assert torch.equal(first, untouched)
    _check_step(impl, first, 2)  # and back


def test_a_cache_repointed_in_place_gets_new_views():
    impl, kv_cache = SpecDecAttentionImpl(HQ, HEAD, HEAD ** -0.5, HKV), _cache(0)
    _check_step(impl, kv_cache, 0)
    old_storage = kv_cache.clone()
    kv_cache.set_(_cache(1))  # same object, other memory
    _check_step(impl, kv_cache, 1)
    kv_cache.set_(_cache(2, BLOCKS + 2))  # other shape and strides
    _check_step(impl, kv_cache, 2)
    assert not torch.equal(kv_cache, old_storage)


def test_profiling_pass_without_metadata_writes_zeros():
    impl = SpecDecAttentionImpl(HQ, HEAD, HEAD ** -0.5, HKV)
    q, k, v, _ = _inputs(0)
    out = torch.full_like(q, float("nan"))
    assert torch.equal(impl.forward(None, q, k, v, torch.empty(0), None, out),
                       torch.zeros_like(q))
