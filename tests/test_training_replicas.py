"""stage_gen --replicas: the arguments a replica run needs, and the merged summary (session 17's
four H100 engines gave 47.7K generated tokens/s together from about 12K each)."""
from __future__ import annotations

import pytest

from training.stage_gen import merge_summaries, parse_args


def test_replica_arguments():
    args = parse_args(["--data", "/tmp/x", "--replica", "2/4"])
    assert (args.replica_index, args.replica_count) == (2, 4)
    with pytest.raises(SystemExit):
        parse_args(["--data", "/tmp/x", "--replica", "4/4"])
    with pytest.raises(SystemExit):  # engines that profile memory side by side need a fixed KV size
        parse_args(["--data", "/tmp/x", "--replicas", "4"])
    assert parse_args(["--data", "/tmp/x", "--replicas", "4", "--kv-cache-gib", "10"]).replicas == 4


def _part(tokens, wall, heldout=None):
    return {"platform": "P", "heldout": heldout,
            "train": {"jobs_total": 10, "jobs_started": 8, "finished": 7, "aborted_at_deadline": 1,
                      "generated_tokens": tokens, "wall_s": wall,
                      "generated_tokens_per_s": tokens / wall},
            "train_shards": {"sequences": 7, "tokens": 3 * tokens}}


def test_merged_summary_adds_counts_and_divides_by_the_longest_replica():
    parts = [_part(1200, 100.0, heldout={"finished": 3}), _part(1000, 80.0), _part(1300, 110.0)]
    merged = merge_summaries(parts)
    assert merged["train"]["generated_tokens"] == 3500
    assert merged["train"]["finished"] == 21 and merged["train"]["jobs_total"] == 30
    assert merged["train"]["wall_s"] == 110.0
    assert merged["train"]["generated_tokens_per_s"] == round(3500 / 110.0, 1)
    assert merged["train_shards"] == {"sequences": 21, "tokens": 10500}
    assert merged["heldout"] == {"finished": 3} and merged["replicas"] == parts
