"""benchmarks/bench_serve_side_by_side.py without servers: its ``vllm bench serve`` command is
one vLLM's own parser accepts as meant, and the side-by-side JSON is assembled right."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_serve_side_by_side")


def test_bench_command_parses_with_vllms_own_parser(bench, tmp_path):
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = bench.parse_args(["--out", str(tmp_path), "--max-concurrency", "7",
                             "--input-len", "33", "--output-len", "17", "--num-prompts", "9"])
    server = SimpleNamespace(base_url="http://127.0.0.1:1234", model="/m")
    command = bench.bench_command(args, server, tmp_path, "x.json")
    assert command[1:5] == ["-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    parsed = parser.parse_args(command[5:])
    assert parsed.dataset_name == "random" and parsed.ignore_eos and parsed.save_result
    assert (parsed.random_input_len, parsed.random_output_len) == (33, 17)
    assert (parsed.num_prompts, parsed.max_concurrency) == (9, 7)
    assert parsed.request_rate == float("inf")
    assert parsed.metric_percentiles == "50,90,99"
    assert parsed.percentile_metrics == "ttft,tpot,itl"
    assert parsed.base_url == "http://127.0.0.1:1234" and parsed.tokenizer == "/m"


def test_unknown_backend_is_refused(bench, tmp_path):
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", str(tmp_path), "--backends", "ours,flash"])


def test_both_backends_get_the_same_server_arguments(bench, tmp_path):
    args = bench.parse_args(["--out", str(tmp_path), "--method", "none", "--dtype", "float16"])
    served = bench.serve_args(args)
    assert served[served.index("--dtype") + 1] == "float16"
    assert "--speculative-config" not in served
    assert bench.BACKEND_ENV["native"] == {"VLLM_PLUGINS": ""}
    assert "VLLM_PLUGINS" not in bench.BACKEND_ENV["ours"]


def test_acceptance_is_the_change_of_the_counters(bench):
    before = {"vllm:spec_decode_num_drafts_total": 10.0,
              "vllm:spec_decode_num_draft_tokens_total": 30.0,
              "vllm:spec_decode_num_accepted_tokens_total": 12.0}
    after = {"vllm:spec_decode_num_drafts_total": 110.0,
             "vllm:spec_decode_num_draft_tokens_total": 330.0,
             "vllm:spec_decode_num_accepted_tokens_total": 162.0}
    got = bench.acceptance(before, after)
    assert got == {"drafts": 100, "draft_tokens": 300, "accepted_tokens": 150,
                   "acceptance_length": 2.5, "acceptance_rate": 0.5}
    assert bench.acceptance({}, {})["acceptance_length"] is None  # no speculation


def test_side_by_side_json_has_percentiles_and_ratios(bench, tmp_path):
    raw = {"completed": 9, "failed": 0, "duration": 3.0, "request_throughput": 3.0,
           "output_throughput": 300.0, "total_token_throughput": 600.0}
    for metric in ("ttft", "tpot", "itl"):
        raw[f"mean_{metric}_ms"] = 10.0
        for p in ("50", "90", "99"):
            raw[f"p{p}_{metric}_ms"] = float(p)
    ours = bench.summarize(raw)
    native = bench.summarize(raw | {"request_throughput": 2.0, "p99_tpot_ms": 33.0})
    args = bench.parse_args(["--out", str(tmp_path)])
    result = bench.assemble(args, {
        "ours": {"bench": ours, "spec": {"acceptance_length": 2.4}},
        "native": {"bench": native, "spec": {"acceptance_length": 2.0}}})
    ratio = result["ours_over_native"]
    assert ratio["request_throughput"] == pytest.approx(1.5)
    assert ratio["p99_tpot_ms"] == pytest.approx(3.0)
    assert ratio["p50_ttft_ms"] == pytest.approx(1.0)
    assert ratio["acceptance_length"] == pytest.approx(1.2)
    assert "failed" not in ratio  # 0 for native: no ratio
    assert result["config"]["out"] == str(tmp_path)
    assert os.path.isabs(result["config"]["out"])
