#!/usr/bin/env python3
"""Structured output (constrained decoding, docs/structured-output.md) end to end
against a real `pagedserve serve` on the default model.

The mask, not the model, does the work: generations at temperature 1.0 with
response_format json_schema all parse and validate with Python `jsonschema`;
guided_regex outputs match with Python `re.fullmatch`; guided_choice outputs are
one of the choices; json_object outputs parse as objects. Negative controls: the
same requests without the constraint do not all validate / match (so the checks
can fail). Unsupported constraints are 400s naming the field, never an
unconstrained answer; the server keeps serving after them.

Tool calling with tool_choice "required" or a named function (docs/http.md): the
official `openai` client parses every streamed and non-streamed answer into
tool_calls of the given tools, whose arguments validate with `jsonschema` against
that tool's parameters, at temperature 1.0 on a model that never learnt the format
(SmolLM2); parallel_tool_calls false gives exactly one call. Control: the same
request with tool_choice "auto" does not give calls every time.

  structured_output_test.py --pagedserve BUILD/runtime/cli/pagedserve --model MODEL.gguf
"""
import argparse
import json
import os
import re
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import http_test  # noqa: E402  (exits 77 when the openai package is missing)
from http_test import ServerProcess, http  # noqa: E402
import openai  # noqa: E402  (http_test exits 77 without it)

try:
    import jsonschema  # noqa: E402
except ImportError:
    print("structured_output_test: skipped, Python jsonschema is missing (pip install jsonschema)")
    sys.exit(77)

ARGS = None
SERVER = None

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "maxItems": 2},
        "born": {"type": "string", "format": "date"},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
REGEX = r"\d{3}-[a-z]{2,4}(!|\?)"
N = 6

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 16},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "exclusiveMaximum": 15}},
            "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Time in a time zone",
        "parameters": {"type": "object", "properties": {
            "tz": {"type": "string", "pattern": "^[A-Z][a-z]{1,12}/[A-Z][a-z]{1,12}$"}},
            "required": ["tz"], "additionalProperties": False}}},
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
TOOL_MESSAGES = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


def setUpModule():
    global SERVER
    SERVER = ServerProcess()


def tearDownModule():
    SERVER.stop()


def chat(extra, n=N, max_tokens=120):
    body = {"model": SERVER.model, "n": n, "temperature": 1.0, "max_tokens": max_tokens, "seed": 7,
            "messages": [{"role": "user", "content": "Describe a person as JSON."}], **extra}
    status, r = http("POST", SERVER.url + "/v1/chat/completions", body, timeout=300)
    return status, r


def completion(extra, prompt="Here is a code:", n=N, max_tokens=24):
    body = {"model": SERVER.model, "n": n, "temperature": 1.0, "max_tokens": max_tokens, "seed": 11,
            "prompt": prompt, **extra}
    return http("POST", SERVER.url + "/v1/completions", body, timeout=300)


def validates(text, schema):
    try:
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


class StructuredOutputTest(unittest.TestCase):
    def test_json_schema_outputs_all_validate_and_the_control_does_not(self):
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
        status, r = chat({"response_format": fmt})
        self.assertEqual(status, 200, r)
        self.assertEqual(len(r["choices"]), N)
        for c in r["choices"]:
            text = c["message"]["content"]
            self.assertEqual(c["finish_reason"], "stop", text)
            self.assertTrue(validates(text, PERSON), text)
        status, control = chat({}, max_tokens=40)
        self.assertEqual(status, 200, control)
        ok = [validates(c["message"]["content"], PERSON) for c in control["choices"]]
        self.assertFalse(all(ok), "the unconstrained control validated every time: the test cannot fail")

    def test_guided_json_on_completions_and_structured_outputs(self):
        schema = {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 99},
                  "minItems": 2, "maxItems": 4}
        for extra in ({"guided_json": schema}, {"structured_outputs": {"json": schema}}):
            status, r = completion(extra, prompt="A list of numbers:", n=4, max_tokens=30)
            self.assertEqual(status, 200, r)
            for c in r["choices"]:
                self.assertEqual(c["finish_reason"], "stop", c["text"])
                self.assertTrue(validates(c["text"], schema), c["text"])

    def test_regex_outputs_match_and_the_control_does_not(self):
        status, r = completion({"guided_regex": REGEX})
        self.assertEqual(status, 200, r)
        for c in r["choices"]:
            self.assertTrue(re.fullmatch(REGEX, c["text"]), c["text"])
            self.assertEqual(c["finish_reason"], "stop", c["text"])
        status, control = completion({})
        self.assertEqual(status, 200, control)
        self.assertFalse(all(re.fullmatch(REGEX, c["text"]) for c in control["choices"]))

    def test_choice_and_json_object(self):
        choices = ["yes", "no", "maybe so"]
        status, r = completion({"guided_choice": choices}, prompt="Will it rain?")
        self.assertEqual(status, 200, r)
        for c in r["choices"]:
            self.assertIn(c["text"], choices)
        status, r = chat({"response_format": {"type": "json_object"}}, n=2, max_tokens=40)
        self.assertEqual(status, 200, r)
        for c in r["choices"]:
            if c["finish_reason"] == "stop":  # an unbounded object may run out of tokens
                self.assertIsInstance(json.loads(c["message"]["content"]), dict)
            else:
                self.assertTrue(c["message"]["content"].startswith("{"))

    def test_refused_constraints_are_400s_naming_the_field(self):
        cases = [
            ({"response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}}}},
             "'not'"),
            ({"guided_regex": "(a)\\1"}, "escape"),
            ({"guided_grammar": "root ::= x"}, "undefined rule 'x'"),
            ({"guided_regex": "a", "guided_choice": ["a"]}, "one constraint"),
            ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
            ({"guided_json": {"type": "string", "maxLength": 100000000}}, "too large"),
        ]
        for extra, word in cases:
            status, r = completion(extra, n=1, max_tokens=4)
            self.assertEqual(status, 400, (extra, r))
            self.assertIn(word, r["error"]["message"], r)
            self.assertTrue(r["error"]["param"], r)
        status, r = completion({"guided_regex": "x+", "use_beam_search": True, "temperature": 0, "n": 2,
                                "best_of": 2}, n=2, max_tokens=4)
        self.assertEqual(status, 400, r)
        self.assertIn("beam search", r["error"]["message"])
        status, r = completion({"guided_regex": "ok"}, n=1, max_tokens=4)
        self.assertEqual((status, r["choices"][0]["text"]), (200, "ok"), r)

    def test_gbnf_grammar_constrains_the_output(self):
        # llama.cpp's GBNF (guided_grammar, structured_outputs.grammar): every
        # sample is a sentence of the grammar.
        grammar = 'root ::= answer "."\nanswer ::= "yes" | "no" | "maybe " [0-9]'
        for extra in ({"guided_grammar": grammar}, {"structured_outputs": {"grammar": grammar}}):
            status, r = completion({**extra, "seed": 5}, n=3, max_tokens=8)
            self.assertEqual(status, 200, r)
            for c in r["choices"]:
                self.assertEqual(c["finish_reason"], "stop", c)
                self.assertRegex(c["text"], r"^(yes|no|maybe [0-9])\.$", c)


class ToolChoiceTest(unittest.TestCase):
    """tool_choice "required" / named: the output is calls of the tools, whatever the model wants."""

    def create(self, **kw):
        args = dict(model=SERVER.model, messages=TOOL_MESSAGES, tools=TOOLS, temperature=1.0,
                    max_tokens=120, seed=5)
        args.update(kw)
        return SERVER.client().with_options(timeout=600).chat.completions.create(**args)

    def check_calls(self, calls, names=None):
        self.assertTrue(calls)
        for call in calls:
            self.assertEqual(call.type, "function")
            self.assertTrue(call.id.startswith("call_"), call.id)
            self.assertIn(call.function.name, names or TOOL_SCHEMAS)
            args = json.loads(call.function.arguments)
            jsonschema.validate(args, TOOL_SCHEMAS[call.function.name])

    def test_required_non_streamed_and_its_control(self):
        # One call per answer (parallel_tool_calls false): the grammar ends the output after it.
        r = self.create(tool_choice="required", n=12, parallel_tool_calls=False)
        self.assertEqual(len(r.choices), 12)
        names = set()
        for c in r.choices:
            self.assertEqual(c.finish_reason, "tool_calls", c.message)
            self.assertIsNone(c.message.content)
            self.check_calls(c.message.tool_calls)
            self.assertEqual(len(c.message.tool_calls), 1)
            names.add(c.message.tool_calls[0].function.name)
        print(f"required, one call: functions chosen {sorted(names)}")
        # parallel_tool_calls true: one or more calls. A model that never learnt the format (as
        # SmolLM2) may chain calls until max_tokens; such an answer is cut ("length") and comes
        # back as text, which is the start of a sentence of the grammar.
        r = self.create(tool_choice="required", n=3, max_tokens=80)
        for c in r.choices:
            if c.finish_reason == "tool_calls":
                self.check_calls(c.message.tool_calls)
            else:
                self.assertEqual(c.finish_reason, "length")
                self.assertTrue(c.message.content.startswith('<tool_call>\n{"name": "'), c.message.content)
        control = self.create(tool_choice="auto", n=4, max_tokens=40)
        self.assertFalse(all(c.message.tool_calls for c in control.choices),
                         "tool_choice auto gave calls every time: the test cannot fail")

    def test_named_function_streamed_and_not(self):
        named = {"type": "function", "function": {"name": "get_time"}}
        r = self.create(tool_choice=named, n=8, seed=9)
        for c in r.choices:
            self.assertEqual(c.finish_reason, "tool_calls")
            self.assertEqual(len(c.message.tool_calls), 1)
            self.check_calls(c.message.tool_calls, names=["get_time"])
        for tool_choice, n in ((named, 3), ("required", 4)):
            stream = self.create(tool_choice=tool_choice, n=n, stream=True, seed=13,
                                 parallel_tool_calls=False)
            calls, finish = {}, {}
            for chunk in stream:
                for c in chunk.choices:
                    self.assertFalse(c.delta.content, c.delta)  # nothing but calls
                    for d in c.delta.tool_calls or []:
                        call = calls.setdefault((c.index, d.index),
                                                {"id": None, "name": "", "args": "", "deltas": 0})
                        if d.id:
                            call["id"] = d.id
                        if d.function and d.function.name:
                            call["name"] += d.function.name
                        if d.function and d.function.arguments:
                            call["args"] += d.function.arguments
                            call["deltas"] += 1
                    if c.finish_reason:
                        finish[c.index] = c.finish_reason
            self.assertEqual(finish, {i: "tool_calls" for i in range(n)})
            for (index, _), call in calls.items():
                self.assertTrue(call["id"].startswith("call_"))
                if tool_choice == named:
                    self.assertEqual(call["name"], "get_time")
                jsonschema.validate(json.loads(call["args"]), TOOL_SCHEMAS[call["name"]])
            self.assertEqual({i for i, _ in calls}, set(range(n)))
            # Arguments stream as they are generated, not in one delta at the end.
            self.assertGreater(max(call["deltas"] for call in calls.values()), 3, calls)

    def test_bad_tool_choices_are_400s(self):
        cases = [
            (dict(tool_choice={"type": "function", "function": {"name": "nope"}}), "nope"),
            (dict(tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
            (dict(tool_choice="required", tools=[{"type": "function", "function": {
                "name": "f", "parameters": {"type": "object", "properties": {"a": {"not": {}}}}}}]), "'not'"),
        ]
        for kw, word in cases:
            with self.assertRaises(openai.BadRequestError) as e:
                self.create(max_tokens=4, **kw)
            self.assertIn(word, str(e.exception))


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--pagedserve", required=True)
    ap.add_argument("--model", required=True)
    ARGS, rest = ap.parse_known_args()
    http_test.require_model("structured_output_test", ARGS.model)
    http_test.ARGS = ARGS
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
