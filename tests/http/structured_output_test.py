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
            ({"guided_grammar": "root ::= \"a\""}, "guided_grammar"),
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
