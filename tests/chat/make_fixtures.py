#!/usr/bin/env python3
"""Renders the chat-template corpus with Python jinja2 in Hugging Face's
apply_chat_template environment and writes the expected outputs that
chat_conformance_test compares runtime/chat against, byte for byte.

    pip install jinja2==3.1.6
    python3 tests/chat/make_fixtures.py [--templates DIR]   # DIR: tests/chat/fetch_templates.sh
    python3 tests/chat/make_fixtures.py --show NAME CASE    # print one expected output

The environment is transformers' _cached_compile_jinja_template (5.x):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension and the {% generation %} tag, the tojson filter
(json.dumps, ensure_ascii=False), raise_exception, strftime_now, dict and a
namespace that refuses underscore-prefixed names; render(messages=..., tools=...,
documents=None, add_generation_prompt=..., bos_token=..., eos_token=...).
strftime_now reads a fixed clock (FIXED_NOW) so that the outputs are stable.

Writes tests/fixtures/chat_templates.json (committed):
  {"jinja2": version, "now": "...", "bos_token", "eos_token",
   "conversations": [{"name", "messages", "tools"?}, ...],
   "templates": {FILE: {"sha256", "bytes", "fnv1a64": of the file,
                        "cases": [{"conversation": i, "add_generation_prompt": b,
                                   "output": text or {"from": an earlier case, "keep": its
                                   first bytes, "text": what follows}} or {..., "error": "Type: message",
                                   "raised": true when raise_exception raised it}]}}}
A template jinja2 cannot parse has "error" at its own level and no cases.
"""
import argparse
import datetime
import hashlib
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "chat_templates.json")
FIXED_NOW = datetime.datetime(2025, 3, 7, 14, 5, 9)
BOS = "<s>"
EOS = "</s>"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "Forecast days", "default": 1},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "max_results": {"type": "number", "minimum": 1.5},
                "strict": {"type": "boolean"},
            },
            "required": ["query", "strict"],
        },
    },
}
NESTED_TOOL = {
    "type": "function",
    "function": {
        "name": "create_event",
        "description": "Create a calendar event.\nDates are \"YYYY-MM-DD\"; times are local.",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "attendees": {"type": "array", "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "optional": {"type": "boolean"}},
                    "required": ["name"]}},
                "priority": {"type": "integer", "enum": [1, 2, 3]},
                "location": {"type": ["string", "null"], "description": "Where — «room» or URL"},
            },
            "required": ["title", "attendees"],
        },
    },
}
NO_PARAMS_TOOL = {"type": "function", "function": {"name": "get_time", "description": "Current time.",
                                                   "parameters": {"type": "object", "properties": {}}}}
TOOL_CALL = {
    "id": "call_7Qx1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
}

CONVERSATIONS = [
    {"name": "user", "messages": [{"role": "user", "content": "Hello!"}]},
    {"name": "system_user", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"}]},
    {"name": "multi_turn", "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "I am an assistant."},
        {"role": "user", "content": "  Tell me a joke.\n"}]},
    {"name": "no_system_multi", "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6"}]},
    {"name": "unicode", "messages": [
        {"role": "user", "content": "Grüße, «ami» — 東京は? \"quotes\" 'single' {{ not a tag }} \\ tab\tend"}]},
    {"name": "tools", "tools": [WEATHER_TOOL, SEARCH_TOOL], "messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What's the weather in Paris?"}]},
    {"name": "tool_call", "tools": [WEATHER_TOOL], "messages": [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_7Qx1", "name": "get_weather",
         "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
        {"role": "user", "content": "Thanks!"}]},
    {"name": "tool_call_no_tools", "messages": [
        {"role": "system", "content": "Be concise."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            TOOL_CALL,
            {"id": "call_9Zr2", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "tool_call_id": "call_7Qx1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_9Zr2", "content": "rain"}]},
    {"name": "string_arguments", "tools": [NESTED_TOOL, NO_PARAMS_TOOL], "messages": [
        {"role": "user", "content": "Book a sync with Ana at 10:00."},
        {"role": "assistant", "content": "Booking it.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {
                "name": "create_event",
                "arguments": "{\"title\": \"Sync\", \"attendees\": [{\"name\": \"Ana\"}], \"priority\": 2}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "create_event", "content": "{\"ok\": true, \"id\": 42}"},
        {"role": "assistant", "content": "Done: event 42."}]},
    {"name": "reasoning", "messages": [
        {"role": "system", "content": "Think step by step."},
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "reasoning_content": "91 = 7 * 13.",
         "content": "<think>\n91 = 7 * 13.\n</think>\n\nNo: 91 = 7 × 13."},
        {"role": "user", "content": "And 97?"}]},
    {"name": "content_parts", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Describe this picture:"},
                                     {"type": "image", "image": "https://example.com/cat.png"},
                                     {"type": "text", "text": "in one word."}]}]},
    {"name": "edge_text", "messages": [
        {"role": "system", "content": ""},
        {"role": "user", "content": "  <|im_end|> {% raw %} \\n \u2028 emoji 🦙 עברית\n\n"},
        {"role": "assistant", "content": "   "},
        {"role": "user", "content": "last"}]},
    {"name": "prefill", "messages": [
        {"role": "user", "content": "Write a haiku."},
        {"role": "assistant", "content": "Autumn moonlight"}]},
]


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker without the tracking: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_support"), [], [], body).set_lineno(lineno)

    def _support(self, caller):
        return caller()


class RaisedError(Exception):
    pass


def make_environment():
    def raise_exception(message):
        raise RaisedError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"cannot store underscore-prefixed attribute {name!r} on a namespace")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def fnv1a64(data):
    """FNV-1a, 64 bits, as hex: the C++ test checks the cached file with it (no sha256 there)."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def render_cases(template):
    cases = []
    for i, conv in enumerate(CONVERSATIONS):
        for agp in (False, True):
            case = {"conversation": i, "add_generation_prompt": agp}
            try:
                case["output"] = template.render(
                    messages=json.loads(json.dumps(conv["messages"])),
                    tools=json.loads(json.dumps(conv["tools"])) if "tools" in conv else None,
                    documents=None, add_generation_prompt=agp, bos_token=BOS, eos_token=EOS)
            except RaisedError as e:
                case["error"] = str(e)
                case["raised"] = True
            except Exception as e:  # the engine must fail too, with its own message
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
    return cases


def common_prefix(a, b):
    n = 0
    limit = min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    while 0 < n < len(b) and (b[n] & 0xC0) == 0x80:  # split on a character boundary
        n -= 1
    return n


def compact(cases):
    """Stores an output that shares a long prefix with an earlier case's output
    of the same template as {"from": that case, "keep": bytes of it, "text": the rest}."""
    earlier = []
    for c in cases:
        data = c["output"].encode("utf-8") if "output" in c else None
        best, source = 0, None
        for j, prev in enumerate(earlier):
            if prev is not None and data is not None:
                n = common_prefix(prev, data)
                if n > best:
                    best, source = n, j
        if best >= 64:
            c["output"] = {"from": source, "keep": best, "text": data[best:].decode("utf-8")}
        earlier.append(data)
    return cases


def build(templates_dir):
    env = make_environment()
    result = {"jinja2": jinja2.__version__, "now": FIXED_NOW.isoformat(), "bos_token": BOS,
              "eos_token": EOS, "conversations": CONVERSATIONS, "templates": {}}
    for name in sorted(os.listdir(templates_dir)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(templates_dir, name), "rb") as f:
            data = f.read()
        entry = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "fnv1a64": fnv1a64(data)}
        try:
            template = env.from_string(data.decode("utf-8"))
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        else:
            entry["cases"] = compact(render_cases(template))
        result["templates"][name] = entry
    return result


def expand(cases, i):
    """The output of case i (or its error), undoing compact()."""
    c = cases[i]
    if "output" not in c:
        return "ERROR " + c["error"]
    out = c["output"]
    if isinstance(out, str):
        return out
    return expand(cases, out["from"]).encode("utf-8")[: out["keep"]].decode("utf-8") + out["text"]


def summary(result):
    rendered = failed = 0
    for entry in result["templates"].values():
        cases = entry.get("cases", [])
        if cases and all("output" in c for c in cases):
            rendered += 1
        else:
            failed += 1
    return f"{len(result['templates'])} templates: {rendered} render every case, {failed} fail some"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--templates", help="folder of .jinja files (default: fetch_templates.sh's)")
    ap.add_argument("--out", default=FIXTURE)
    ap.add_argument("--show", nargs=2, metavar=("NAME", "CASE"),
                    help="print the expected output of case CASE (an index) of template NAME")
    args = ap.parse_args()
    if args.show:
        with open(args.out, encoding="utf-8") as f:
            cases = json.load(f)["templates"][args.show[0]]["cases"]
        sys.stdout.write(expand(cases, int(args.show[1])))
        return
    templates = args.templates
    if not templates:
        import subprocess
        templates = subprocess.check_output(
            [os.path.join(ROOT, "tests", "chat", "fetch_templates.sh")], text=True).strip()
    result = build(templates)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1, sort_keys=False)
        f.write("\n")
    print(f"{args.out}: {summary(result)} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
