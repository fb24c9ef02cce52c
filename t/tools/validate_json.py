#!/usr/bin/python3
"""Validates generated answers against their JSON Schemas with the jsonschema package (an
independent validator). Reads a JSON list of {"schema": ..., "text": ...} on stdin; prints one
line per item: "ok", or "bad: <reason>"."""
import json
import sys

import jsonschema

for item in json.load(sys.stdin):
    try:
        value = json.loads(item["text"])
    except ValueError as e:
        print("bad: does not parse: %s" % e)
        continue
    cls = jsonschema.validators.validator_for(item["schema"], default=jsonschema.Draft202012Validator)
    v = cls(item["schema"], format_checker=cls.FORMAT_CHECKER)
    errs = list(v.iter_errors(value))
    print("ok" if not errs else "bad: %s" % errs[0].message.replace("\n", " ")[:200])
