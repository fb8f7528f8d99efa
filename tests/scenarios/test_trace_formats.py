"""Published trace layouts read as they are: Azure, BurstGPT, Vidur, Mooncake JSON lines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scenarios.errors import WorkloadError
from scenarios.traces import read_trace

EXPECTED_ARRIVALS = [0.0, 0.25, 1.5]
EXPECTED_INPUT, EXPECTED_OUTPUT = [100, 2000, 37], [10, 1, 400]


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _check(trace, arrivals=EXPECTED_ARRIVALS):
    np.testing.assert_allclose(trace["arrival_time_s"], arrivals, rtol=0, atol=1e-9)
    assert trace["input_tokens"].tolist() == EXPECTED_INPUT
    assert trace["output_tokens"].tolist() == EXPECTED_OUTPUT


def test_azure_timestamps_become_seconds_after_the_first(tmp_path):
    path = _write(tmp_path, "AzureLLMInferenceTrace_conv.csv",
                  "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:15:46.6805900,100,10\n"
                  "2023-11-16 18:15:46.9305900,2000,1\n"
                  "2023-11-16 18:15:48.1805900,37,400\n")
    _check(read_trace(path))


def test_burstgpt_columns_are_read_and_the_others_ignored(tmp_path):
    path = _write(tmp_path, "BurstGPT_1.csv",
                  "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                  "5,ChatGPT,100,10,110,Conversation log\n"
                  "5.25,GPT-4,2000,1,2001,API log\n"
                  "6.5,ChatGPT,37,400,437,Conversation log\n")
    _check(read_trace(path), [5.0, 5.25, 6.5])  # replay windows rebase to the first arrival


def test_vidur_processed_trace(tmp_path):
    path = _write(tmp_path, "splitwise_conv.csv",
                  "arrived_at,num_prefill_tokens,num_decode_tokens\n"
                  "0,100,10\n0.25,2000,1\n1.5,37,400\n")
    _check(read_trace(path))


def test_mooncake_json_lines_with_hash_ids(tmp_path):
    rows = [{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [0, 1]},
            {"timestamp": 250, "input_length": 2000, "output_length": 1, "hash_ids": [0, 2, 3]},
            {"timestamp": 1500, "input_length": 37, "output_length": 400, "hash_ids": []}]
    path = _write(tmp_path, "conversation_trace.jsonl",
                  "\n".join(json.dumps(r) for r in rows) + "\n")
    trace = read_trace(path)
    _check(trace)
    assert trace["hash_ids"].tolist() == [(0, 1), (0, 2, 3), ()]


@pytest.mark.parametrize("name, text, problem", [
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n",
     "column 'TIMESTAMP' row 0 .*expected a date-time"),
    ("b.csv", "Timestamp,Request tokens,Response tokens\n0,1,1\n1,-3,1\n",
     "column 'Request tokens' row 1"),
    ("c.csv", "when,prompt,answer\n0,1,1\n",
     "unknown trace columns.*Azure LLM inference trace.*BurstGPT.*Vidur.*Mooncake"),
    ("d.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": 5\n',
     "line 2 is not JSON"),
    ("e.jsonl", '{"timestamp": 0, "input_length": 1}\n',
     "line 1 lacks one of the Mooncake keys"),
    ("f.jsonl", '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": "x"}\n',
     "'hash_ids' is 'x'; expected a list of integers"),
    ("g.jsonl", '{"timestamp": 9, "input_length": 1, "output_length": 1}\n'
                '{"timestamp": 2, "input_length": 1, "output_length": 1}\n',
     "timestamp is not sorted: row 1"),
    ("h.jsonl", '{"timestamp": "noon", "input_length": 1, "output_length": 1}\n',
     "column 'timestamp' row 0 .*'noon'"),
])
def test_bad_published_traces_give_one_clear_error(tmp_path, name, text, problem):
    with pytest.raises(WorkloadError, match=problem) as err:
        read_trace(_write(tmp_path, name, text))
    assert err.value.field == "workload.trace_path" and "\n" not in str(err.value)
