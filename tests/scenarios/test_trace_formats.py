"""Published trace layouts read as they are: Azure, BurstGPT, Vidur, Mooncake JSON lines."""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import json
import lzma
import re
import sys
import zipfile

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
     "line 1: 'timestamp' is \"noon\"; expected a JSON number"),
])
def test_bad_published_traces_give_one_clear_error(tmp_path, name, text, problem):
    with pytest.raises(WorkloadError, match=problem) as err:
        read_trace(_write(tmp_path, name, text))
    assert err.value.field == "workload.trace_path" and "\n" not in str(err.value)


MOONCAKE = "".join(json.dumps(r) + "\n" for r in (
    {"timestamp": 0, "input_length": 100, "output_length": 10},
    {"timestamp": 250, "input_length": 2000, "output_length": 1},
    {"timestamp": 1500, "input_length": 37, "output_length": 400}))
OURS = ("arrival_time_s,input_tokens,output_tokens\n"
        "0,100,10\n0.25,2000,1\n1.5,37,400\n")


def _zip(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("trace", data)
    return buffer.getvalue()


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress, _zip])
@pytest.mark.parametrize("name, text", [("conversation_trace.jsonl.gz", MOONCAKE),
                                        ("trace.jsonl", MOONCAKE), ("trace.csv", OURS),
                                        ("trace.data", OURS)])
def test_a_compressed_trace_is_read_by_its_content_whatever_its_name(tmp_path, compress, name,
                                                                      text):
    path = tmp_path / name
    path.write_bytes(compress(text.encode()))
    _check(read_trace(str(path)))


def test_a_zstd_trace_is_read_with_zstandard(tmp_path):
    zstandard = pytest.importorskip("zstandard", reason="zstandard (optional) not installed")
    path = tmp_path / "conversation_trace.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(MOONCAKE.encode()))
    _check(read_trace(str(path)))


def test_a_zstd_trace_without_zstandard_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard fails
    path = tmp_path / "trace.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(16))
    with pytest.raises(WorkloadError, match=r"cannot decompress as zstd .*pip install "
                                            r"zstandard.*zstd -d") as e:
        read_trace(str(path))
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("name, text", [("bom.jsonl", MOONCAKE), ("bom.csv", OURS),
                                        ("bom_crlf.csv", OURS.replace("\n", "\r\n"))])
def test_a_byte_order_mark_is_ignored(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(codecs.BOM_UTF8 + text.encode())
    _check(read_trace(str(path)))


@pytest.mark.parametrize("text, problem", [
    # the second record is line 2: no header in JSON lines
    ('{"timestamp": 0, "input_length": 1, "output_length": 1}\n'
     '{"timestamp": 5, "input_length": -3, "output_length": 1}\n',
     r"column 'input_length' row 1 \(line 2\) is -3"),
    # blank lines count as an editor counts them
    ('\n{"timestamp": 0, "input_length": 1, "output_length": 1}\n\n\n'
     '{"timestamp": 5, "input_length": 1, "output_length": 2.5}\n',
     r"column 'output_length' row 1 \(line 5\) is 2.5"),
    ('{"timestamp": 9, "input_length": 1, "output_length": 1}\n\n'
     '{"timestamp": 2, "input_length": 1, "output_length": 1}\n',
     r"timestamp is not sorted: row 1 \(line 3\)"),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n\n'
     '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [' + "9" * 400 + ']}\n'
     '{"timestamp": 2, "input_length": ' + "9" * 400 + ', "output_length": 1}\n',
     r"column 'input_length' row 2 \(line 4\) is inf; expected a finite number"),
])
def test_json_lines_errors_name_the_line_of_the_file(tmp_path, text, problem):
    with pytest.raises(WorkloadError, match=problem):
        read_trace(_write(tmp_path, "t.jsonl", text))


@pytest.mark.parametrize("value", ["true", "false", '"100"', "null", "[100]", "{}"])
@pytest.mark.parametrize("key", ["timestamp", "input_length", "output_length"])
def test_json_lines_numbers_are_json_numbers(tmp_path, key, value):
    """``"input_length": true`` is no 1-token prompt, nor ``"100"`` a length."""
    rec = {"timestamp": 0, "input_length": 10, "output_length": 5}
    text = json.dumps(rec) + "\n" + json.dumps(rec).replace(f'"{key}": {rec[key]}',
                                                            f'"{key}": {value}') + "\n"
    with pytest.raises(WorkloadError, match=f"line 2: '{key}' is {re.escape(value)}; expected "
                       "a JSON number") as err:
        read_trace(_write(tmp_path, "t.jsonl", text))
    assert "\n" not in str(err.value)
