"""Sampling settings the late-drafts tests share, on the CPU (test_suffix_async_engine.py) and
on the GPU (gpu/test_suffix_async_gpu.py): penalties, which read the drafts' host copy that a
late step writes after the step's preparation, and a JSON schema, whose grammar bitmask the
scheduler makes before a late step's drafts exist."""

PENALTIES = {"repetition_penalty": 1.2, "frequency_penalty": 0.3, "presence_penalty": 0.2}
# Short answers that end (a bounded string and a boolean), so EOS is not ignored.
JSON_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "ok"],
               "properties": {"name": {"type": "string", "maxLength": 16},
                              "ok": {"type": "boolean"}}}
