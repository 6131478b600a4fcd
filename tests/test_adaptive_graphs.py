"""The extra graph dispatchers for adaptive draft lengths (specdec_plugin/adaptive/graphs.py),
built from a real vLLM config on the CPU: one per query length, uniform full decode keys only,
each key padded to a multiple of its own query length."""
from __future__ import annotations

K = 4


def _graph_config():
    from vllm.config import VllmConfig
    from vllm.config.compilation import CompilationMode, CUDAGraphMode

    config = VllmConfig()
    compilation = config.compilation_config
    # What our CUDA platform leaves in place: full decode graphs at n*(1+K), piecewise mixed.
    compilation.mode = CompilationMode.VLLM_COMPILE
    compilation.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    compilation.splitting_ops = list(compilation._attention_ops)
    compilation.cudagraph_capture_sizes = [5, 10, 20, 40, 80, 160, 320]
    compilation.max_cudagraph_capture_size = 320
    return config


def test_one_dispatcher_per_query_length_with_uniform_full_keys():
    from vllm.config.compilation import CUDAGraphMode

    from specdec_plugin.adaptive.graphs import query_len_dispatchers

    config = _graph_config()
    dispatchers = query_len_dispatchers(config, CUDAGraphMode.FULL_AND_PIECEWISE, K, 8192)
    assert sorted(dispatchers) == [1, 2, 3, 4]
    for q, dispatcher in dispatchers.items():
        keys = dispatcher.cudagraph_keys[CUDAGraphMode.FULL]
        assert not dispatcher.cudagraph_keys[CUDAGraphMode.PIECEWISE]
        # The same request counts as vLLM's (1+K)-token graphs: 1, 2, 4, ..., 64.
        assert sorted(k.num_reqs for k in keys) == [1, 2, 4, 8, 16, 32, 64]
        assert all(k.uniform and k.num_tokens == q * k.num_reqs for k in keys)
        # Three requests of q tokens each replay the graph of four.
        mode, desc = dispatcher.dispatch(3 * q, uniform_decode=True)
        assert mode == CUDAGraphMode.FULL and (desc.num_tokens, desc.num_reqs) == (4 * q, 4)
    # The user's config is untouched: vLLM's own dispatcher still pads to multiples of 1+K.
    assert config.compilation_config.cudagraph_capture_sizes == [5, 10, 20, 40, 80, 160, 320]


def test_no_extra_dispatchers_beyond_the_token_budget():
    from vllm.config.compilation import CUDAGraphMode

    from specdec_plugin.adaptive.graphs import query_len_dispatchers

    dispatchers = query_len_dispatchers(_graph_config(), CUDAGraphMode.FULL_AND_PIECEWISE, K, 16)
    for q, dispatcher in dispatchers.items():
        assert max(k.num_tokens for k in dispatcher.cudagraph_keys[CUDAGraphMode.FULL]) <= 16


def test_the_runner_dispatcher_lists_every_query_length_for_capture():
    from vllm.config.compilation import CUDAGraphMode

    from specdec_plugin.adaptive.graphs import QueryLengthDispatcher, query_len_dispatchers

    config = _graph_config()
    main = QueryLengthDispatcher(config)
    main.uniform_decode_query_len = 1 + K  # what a config with K speculative tokens gives
    main.initialize_cudagraph_keys(CUDAGraphMode.FULL_AND_PIECEWISE, 1 + K)
    own = sum(len(descs) for _, descs in main.get_capture_descs())
    main.extra = query_len_dispatchers(config, CUDAGraphMode.FULL_AND_PIECEWISE, K, 8192)
    descs = [d for _, ds in main.get_capture_descs() for d in ds]
    assert len(descs) == own + 4 * 7
    assert {d.num_tokens // d.num_reqs for d in descs if d.uniform} == {1, 2, 3, 4, 5}


def test_capture_lists_one_group_per_mode_so_the_graph_estimate_counts_every_graph():
    """vLLM's graph-memory estimate keys its per-graph figure by mode: a second FULL group
    would overwrite the first one's, and the estimate would miss most graphs."""
    from vllm.config.compilation import CUDAGraphMode

    from specdec_plugin.adaptive.graphs import QueryLengthDispatcher, query_len_dispatchers

    config = _graph_config()
    main = QueryLengthDispatcher(config)
    main.uniform_decode_query_len = 1 + K
    main.initialize_cudagraph_keys(CUDAGraphMode.FULL_AND_PIECEWISE, 1 + K)
    main.extra = query_len_dispatchers(config, CUDAGraphMode.FULL_AND_PIECEWISE, K, 8192)
    groups = main.get_capture_descs()
    modes = [mode for mode, _ in groups]
    assert modes == [CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL]
    full = dict(groups)[CUDAGraphMode.FULL]
    assert len(full) == 5 * 7  # vLLM's 1+K graphs and four extra query lengths, 7 counts each
    sizes = [(d.num_tokens, d.num_active_loras) for d in full]
    assert sizes == sorted(sizes, reverse=True)
