#!/usr/bin/env python3
"""Validity of constrained generation over the JSON-Schema-Test-Suite (issue 32).

For every schema of tests/grammar/suite/*.json (draft 2020-12) this asks a running
`pagedserve serve` for --n chat completions at temperature 1.0 with
`response_format` {"type": "json_schema"} (the mask, not the model, does the work)
and validates each output with Python `jsonschema` (Draft202012Validator). A schema
the server refuses (400: an unsupported keyword) is counted as refused, never as
generated. Beside it, the same requests without `response_format` (the control):
the rate at which unconstrained sampling happens to produce a valid instance.

    python3 bench/structured_output_validity.py --url http://127.0.0.1:8000 [--n 20] [--json-out F]

Outputs that end by length (--max-tokens reached before the JSON closed) are
reported apart: they are truncated, not invalid choices of the automaton.
"""

import argparse
import glob
import json
import os
import sys
import urllib.error
import urllib.request

import jsonschema

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def post(url, body, timeout=600):
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def judge(schema, choices, tally):
    validator = jsonschema.Draft202012Validator(schema)
    for c in choices:
        text = c["message"]["content"] or ""
        if c["finish_reason"] == "length":
            tally["truncated"] += 1
            continue
        try:
            value = json.loads(text)
        except ValueError:
            tally["invalid"] += 1
            tally["examples"].append(text[:120])
            continue
        if validator.is_valid(value):
            tally["valid"] += 1
        else:
            tally["invalid"] += 1
            tally["examples"].append(text[:120])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--n", type=int, default=20, help="generations per schema and side")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    sides = {s: {"valid": 0, "invalid": 0, "truncated": 0, "examples": []} for s in ("constrained", "control")}
    schemas = refused = 0
    for path in sorted(glob.glob(os.path.join(ROOT, "tests/grammar/suite/*.json"))):
        for group in json.load(open(path)):
            schema = group["schema"]
            prompt = f"Write one JSON value that matches this JSON Schema, and nothing else:\n{json.dumps(schema)}"
            body = {"messages": [{"role": "user", "content": prompt}], "n": args.n, "temperature": 1.0,
                    "max_tokens": args.max_tokens, "seed": args.seed}
            status, r = post(args.url, {**body, "response_format": {
                "type": "json_schema", "json_schema": {"name": "suite", "schema": schema}}})
            if status == 400:
                refused += 1
                continue
            if status != 200:
                sys.exit(f"{os.path.basename(path)} '{group['description']}': HTTP {status}: {r}")
            schemas += 1
            judge(schema, r["choices"], sides["constrained"])
            status, r = post(args.url, body)
            if status != 200:
                sys.exit(f"control for '{group['description']}': HTTP {status}: {r}")
            judge(schema, r["choices"], sides["control"])
            c, u = sides["constrained"], sides["control"]
            print(f"{os.path.basename(path)}: {group['description']}: so far constrained "
                  f"{c['valid']} valid / {c['invalid']} invalid / {c['truncated']} truncated, control "
                  f"{u['valid']} / {u['invalid']} / {u['truncated']}", flush=True)
    out = {"schemas_generated": schemas, "schemas_refused": refused, "n": args.n, **sides}
    for s in sides.values():
        s["examples"] = s["examples"][:10]
    for name, s in sides.items():
        done = s["valid"] + s["invalid"]
        print(f"{name}: {s['valid']} valid / {done} complete outputs ({100.0 * s['valid'] / max(done, 1):.1f}%), "
              f"{s['truncated']} truncated at --max-tokens")
    print(f"schemas: {schemas} generated, {refused} refused (400)")
    if args.json_out:
        json.dump(out, open(args.json_out, "w"), indent=1)
    sys.exit(0 if sides["constrained"]["invalid"] == 0 else 1)


if __name__ == "__main__":
    main()
