#!/usr/bin/env python3
# loradb-test: args=loradb_cli timeout=600
"""Oracle test: loradb's chat template engine (text/chat_template.h, driven through
`loradb tokenize chat --jsonl`) against transformers' own rendering (apply_chat_template's
_normalize_chat_messages + render_jinja_template, i.e. jinja2's ImmutableSandboxedEnvironment with
trim_blocks / lstrip_blocks and transformers' globals and tojson).

usage: chat_template_oracle.py LORADB_CLI

Templates:
  - tests/testdata/chat_templates/*.jinja: the families' prompt formats and the Jinja features
    they use, written for these tests (always run);
  - the published chat templates that llama.cpp keeps in models/templates/, read from the
    llama-cpp-python sdist at a pinned version (downloaded with pip into a cache outside the
    repository, LORADB_TEST_CACHE or ~/.cache/loradb-tests; skipped with the reason printed when
    it cannot be had). Templates that transformers itself cannot render are left out.
Each template renders every conversation of a varied set (system prompts, multi-turn, tool calls
and results, reasoning, list content, unicode, null fields, empty strings) with and without
add_generation_prompt, with and without tools, and with extra variables (enable_thinking); the
outputs must be byte-identical, and where jinja2 raises, loradb must fail too.
Exit status 77 (skipped) without transformers / jinja2.
"""
import glob
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile

try:
    import jinja2  # noqa: F401
    from transformers.tokenization_utils_base import _normalize_chat_messages
    from transformers.utils.chat_template_utils import render_jinja_template
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

CLI = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.join(HERE, "..", "testdata", "chat_templates")
SDIST = "llama-cpp-python==0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    if len(FAILURES) <= 20:
        print("FAIL:", msg)


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city, in °C.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer", "enum": [1, 2, 3]}}, "required": ["city"]}}}]
CALL = {"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "  padded  \n"}, {"role": "assistant", "content": "ok "},
     {"role": "user", "content": "日本語 ✨ émoji 👍🏽 \"quotes\" 'single' \\ back"}],
    [{"role": "user", "content": "Weather in Zürich?"},
     {"role": "assistant", "content": None, "tool_calls": [CALL]},
     {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21.5}"},
     {"role": "user", "content": "Thanks"}],
    [{"role": "user", "content": "Think first."},
     {"role": "assistant", "content": "<think>\nstep 1\n</think>\n\nThe answer.",
      "reasoning_content": None},
     {"role": "user", "content": "Again"},
     {"role": "assistant", "content": "Sure.", "reasoning_content": "short thought"}],
    [{"role": "system", "content": [{"type": "text", "text": "Parts system"}]},
     {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
    [{"role": "user", "content": "x" * 300 + "\n\n\ny"}, {"role": "assistant", "content": "z"},
     {"role": "user", "content": "<tool_response>\nr\n</tool_response>"}],
]
VARIANTS = [({"add_generation_prompt": False}, None, None),
            ({"add_generation_prompt": True}, None, None),
            ({"add_generation_prompt": True}, TOOLS, None),
            ({"add_generation_prompt": True}, None, {"enable_thinking": False}),
            ({"add_generation_prompt": False}, TOOLS, {"documents_hint": 1})]


def reference(source, messages, add_generation_prompt, tools, extra):
    try:
        chat = _normalize_chat_messages(messages)
        rendered, _ = render_jinja_template(
            conversations=[chat], tools=tools, chat_template=source,
            add_generation_prompt=add_generation_prompt, **SPECIAL, **(extra or {}))
        return {"text": rendered[0]}
    except Exception as e:  # noqa: BLE001  (jinja2 raises many types)
        return {"error": f"{type(e).__name__}: {e}"}


def run_loradb(template_path, requests):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        path = f.name
    try:
        r = subprocess.run([CLI, "tokenize", "chat", template_path, "--jsonl", path],
                           capture_output=True)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        return None, r.stderr.decode(errors="replace")
    return [json.loads(line) for line in r.stdout.decode().split("\n") if line], None


def check_template(name, path, source, workdir, require_success=True):
    """Returns True when transformers renders at least one case (the template is usable)."""
    # A copy with the special tokens in tokenizer_config.json beside it, as a model ships it.
    model = os.path.join(workdir, name.replace("/", "_"))
    os.makedirs(model, exist_ok=True)
    with open(os.path.join(model, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"chat_template": source, **SPECIAL}, f, ensure_ascii=False)
    requests, expected = [], []
    for messages in CONVERSATIONS:
        for flags, tools, extra in VARIANTS:
            req = {"messages": messages, **flags}
            if tools is not None:
                req["tools"] = tools
            if extra is not None:
                req["extra"] = extra
            requests.append(req)
            expected.append(reference(source, messages, flags["add_generation_prompt"], tools,
                                      extra))
    if not any("text" in e for e in expected):
        if require_success:
            fail(f"{name}: transformers renders none of the cases")
        return False
    got, err = run_loradb(model, requests)
    if got is None:
        fail(f"{name}: loradb refused the template: {err.strip()}")
        return True
    bad = 0
    for req, e, g in zip(requests, expected, got):
        if ("text" in e) != ("text" in g) or e.get("text") != g.get("text"):
            bad += 1
            fail(f"{name}: {json.dumps(req, ensure_ascii=False)[:160]}\n  transformers: "
                 f"{json.dumps(e, ensure_ascii=False)[:300]}\n  loradb:       "
                 f"{json.dumps(g, ensure_ascii=False)[:300]}")
    errors = sum("error" in e for e in expected)
    print(f"{name}: {len(requests)} renders ({errors} raise in jinja2), "
          f"{len(requests) - bad} identical")
    return True


def published_templates():
    """The llama.cpp templates of the pinned sdist, from the cache (downloading it once)."""
    cache = os.environ.get("LORADB_TEST_CACHE",
                           os.path.join(os.path.expanduser("~"), ".cache", "loradb-tests"))
    os.makedirs(cache, exist_ok=True)
    archive = os.path.join(cache, SDIST_FILE)
    if not os.path.exists(archive):
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                            "llama-cpp-python", SDIST, "-d", cache], capture_output=True,
                           timeout=300)
        if r.returncode != 0 or not os.path.exists(archive):
            return None, f"pip could not download {SDIST}: {r.stderr.decode()[-300:]}"
    with open(archive, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != SDIST_SHA256:
        return None, f"{archive} has sha256 {digest}, expected {SDIST_SHA256}"
    out = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if "/models/templates/" in member.name and member.name.endswith(".jinja"):
                out[os.path.basename(member.name)] = tar.extractfile(member).read().decode()
    return out, None


def main():
    import transformers
    print(f"transformers {transformers.__version__}, jinja2 {jinja2.__version__}")
    with tempfile.TemporaryDirectory() as workdir:
        for path in sorted(glob.glob(os.path.join(TESTDATA, "*.jinja"))):
            with open(path, encoding="utf-8") as f:
                source = f.read()
            check_template(os.path.basename(path), path, source, workdir)
        published, reason = published_templates()
        if published is None:
            print(f"skipped the published templates: {reason}")
        else:
            usable = 0
            for name, source in sorted(published.items()):
                usable += check_template(f"llama.cpp/{name}", None, source, workdir,
                                         require_success=False)
            print(f"published templates: {usable} of {len(published)} render in transformers")
    if FAILURES:
        print(f"{len(FAILURES)} failures")
        return 1
    print("all identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
