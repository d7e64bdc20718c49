#!/usr/bin/python3
"""make_corpus_rt.py - writes the seed corpora of the executable's input fuzzers:
  tests/fuzz/corpus_data/  token shards (fuzz_data): llm.c shards with uint16 and uint32 tokens,
                           raw uint16 files, and each kind of damage the reader names (a cut
                           header, a count beyond or short of the file, a byte-swapped or bad
                           magic number, another version, an odd size, ids beyond the vocabulary);
  tests/fuzz/corpus_cli/   command lines (fuzz_cli), argv split on NUL: every command and flag,
                           values out of range, unknown flags and commands, clashes;
  tests/fuzz/corpus_state/ checkpoint state.json files (fuzz_state): variants of the one the
                           fuzzer's own checkpoint writer produces (state_ok.json, written by
                           `MBT_FUZZ_STATE_SEED=tests/fuzz/corpus_state/state_ok.json
                           build/fuzz/fuzz_state -runs=0 /dev/null`), with fields removed, changed
                           or of the wrong type.
The files are committed; rerun this after changing it:   /usr/bin/python3 tests/fuzz/make_corpus_rt.py
"""
import json
import re
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(sub, files):
    d = os.path.join(HERE, sub)
    os.makedirs(d, exist_ok=True)
    for name, b in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(b)


def llmc(tokens, magic=20240520, version=1, count=None, width=2):
    hdr = struct.pack("<3i", magic, version, len(tokens) if count is None else count) + b"\0" * (1024 - 12)
    return hdr + struct.pack(f"<{len(tokens)}{'H' if width == 2 else 'I'}", *tokens)


toks = [i % 97 for i in range(40)]
write("corpus_data", {
    "ok_llmc_u16": llmc(toks),
    "ok_llmc_u32": llmc([t * 3 for t in toks], magic=20240801, width=4),
    "ok_raw_u16": struct.pack("<20H", *toks[:20]),
    "ok_one_window": llmc([1, 2, 3, 4]),
    "ok_big_ids": llmc([70000, 1, 2, 3, 2**31 - 1, 2**31, 5], magic=20240801, width=4),
    "bad_empty": b"",
    "bad_header_cut": llmc(toks)[:600],
    "bad_count_beyond": llmc(toks, count=41),
    "bad_count_short": llmc(toks, count=39),
    "bad_count_negative": llmc(toks, count=-1),
    "bad_version": llmc(toks, version=2),
    "bad_magic_swapped": struct.pack(">i", 20240520) + llmc(toks)[4:],
    "bad_magic": llmc(toks, magic=20240521),
    "bad_odd_size": b"\x01\x00\x02",
    "bad_vocab": llmc([1, 2, 400, 3, 60000, 4]),
    "bad_too_short": llmc([1]),
})

def argv(*a):
    return b"\0".join(x.encode() for x in a)

write("corpus_cli", {
    "help": argv("prog", "--help"),
    "help_after": argv("./a/b/prog", "train", "--steps", "3", "-h"),
    "none": argv("prog"),
    "train_all": argv("prog", "train", "bigram", "--steps", "5", "--seed", "18446744073709551615", "--threads", "2",
                      "--device", "cpu", "--data", "d/*.bin", "--log", "l.jsonl", "--init-weights", "w.safetensors",
                      "--save-weights", "o.safetensors", "--ckpt-dir", "ck", "--ckpt-every", "2", "--ckpt-keep", "1",
                      "--ckpt-sync"),
    "train_eq": argv("prog", "train", "--steps=5", "--device=cuda", "--resume=latest", "--dump-step=s.safetensors"),
    "train_resume_clash": argv("prog", "train", "--resume", "latest", "--init-weights", "w"),
    "train_weights_only": argv("prog", "train", "--resume-weights-only", "ck/step-4"),
    "eval": argv("prog", "eval", "--steps", "1", "--weights", "w.safetensors", "--data", "v.bin"),
    "eval_zero_steps": argv("prog", "eval", "--steps", "0"),
    "generate": argv("prog", "generate", "--prompt-tokens", "1,2,63", "--max-tokens", "10", "--temperature", "0.8",
                     "--top-k", "5", "--print-logits"),
    "generate_bad_prompt": argv("prog", "generate", "--prompt-tokens", "1,,64"),
    "generate_prompt_empty": argv("prog", "generate", "--prompt-tokens="),
    "generate_prompt_huge": argv("prog", "generate", "--prompt-tokens", "99999999999999999999999"),
    "bad_temperature": argv("prog", "generate", "--temperature", "nan"),
    "bad_threads": argv("prog", "train", "--threads", "0"),
    "bad_steps": argv("prog", "train", "--steps", "-1"),
    "bad_unknown_flag": argv("prog", "train", "--stepz", "1"),
    "bad_unknown_command": argv("prog", "trian"),
    "bad_serve": argv("prog", "serve"),
    "bad_flag_first": argv("prog", "--steps", "1"),
    "bad_missing_value": argv("prog", "train", "--data"),
    "bad_flag_value": argv("prog", "train", "--ckpt-sync=1"),
    "bad_wrong_command": argv("prog", "generate", "--data", "x"),
    "bad_train_name": argv("prog", "train", "other"),
    "bad_extra": argv("prog", "generate", "extra"),
    # error-message-newline-in-argument: a message quoting it was two lines (rt_error.c now makes it one)
    "bad_newline_in_argument": argv("prog", "tr\nain"),
    "bad_newline_in_prog": argv("\xfa\xfaprog\ntripr"),
    "bad_escape_in_value": argv("prog", "train", "--steps", "\x1b[2J"),
})

# ---- state.json: variants of the writer's own (its shard's temporary path made a fixed one)
ok_text = open(os.path.join(HERE, "corpus_state", "state_ok.json")).read()
ok = json.loads(ok_text)
ok["data"]["files"][0]["path"] = "/data/shard.bin"


def text(doc):
    return (json.dumps(doc, indent=2) + "\n").encode()


def variant(edit):
    doc = json.loads(json.dumps(ok))
    edit(doc)
    return text(doc)


def setk(path, value):
    def edit(doc):
        d = doc
        for k in path[:-1]:
            d = d[k]
        if value is DELETE:
            del d[path[-1]]
        else:
            d[path[-1]] = value
    return edit


DELETE = object()
states = {
    "ok_fixed_path.json": text(ok),
    "ok_unchecked.json": b"!" + ok_text.encode(),
    "bad_self_sum.json": b"!" + re.sub(r'("state_xxh3_128": ")(.)', lambda m: m.group(1) + ("0" if m.group(2) != "0" else "1"),
                                         ok_text).encode(),
    "bad_no_self.json": variant(setk(["state_xxh3_128"], DELETE)),
    "bad_self_twice.json": text(ok).replace(b'"format"', b'"state_xxh3_128": "00000000000000000000000000000000",\n  "format"', 1),
    "bad_format.json": variant(setk(["format"], "other")),
    "bad_version.json": variant(setk(["version"], 1)),
    "bad_step_negative.json": variant(setk(["step"], -1)),
    "bad_step_string.json": variant(setk(["step"], "3")),
    "bad_step_huge.json": variant(setk(["step"], 2**63)),
    "bad_seed_negative.json": variant(setk(["rng", "seed"], -1)),
    "bad_fingerprint.json": variant(setk(["data", "fingerprint"], "7639954160c6220")),
    "bad_fingerprint_hex.json": variant(setk(["data", "fingerprint"], "zz39954160c6220e")),
    "bad_window_beyond.json": variant(setk(["data", "window"], 10**6)),
    "bad_files_missing.json": variant(setk(["data", "files"], DELETE)),
    "bad_files_object.json": variant(setk(["data", "files"], {})),
    "bad_file_entry.json": variant(setk(["data", "files"], [{"path": 3}])),
    "bad_file_two.json": variant(setk(["data", "files"], ok["data"]["files"] * 2)),
    "bad_file_bytes.json": variant(setk(["data", "files"], [dict(ok["data"]["files"][0], bytes=1)])),
    "bad_model_sum.json": variant(setk(["files", "model.safetensors", "xxh3_128"], "0" * 32)),
    "bad_model_bytes.json": variant(setk(["files", "model.safetensors", "bytes"], 1)),
    "bad_optimizer_missing.json": variant(setk(["files", "optimizer.safetensors"], DELETE)),
    "bad_layout_micro.json": variant(setk(["layout", "micro"], 8)),
    "bad_train_name.json": variant(setk(["program", "train"], "other")),
    "bad_state_vars.json": variant(setk(["optimizer", "state"], ["m", "v"])),
    "bad_hash.json": variant(setk(["program", "hash"], "abc")),
    "bad_not_json.json": b"{\"format\": \"mbt-checkpoint\",",
    "bad_array.json": b"[]",
    "bad_empty.json": b"",
    "bad_nul.json": text(ok).replace(b'"bigram"', b'"big\\u0000ram"'),
}
write("corpus_state", states)
