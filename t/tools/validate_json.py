#!/usr/bin/python3
"""Validates generated answers against their JSON Schemas with the jsonschema package (an
independent validator). Reads a JSON list of {"schema": ..., "text": ..., "partial": bool} on
stdin; prints one line per item: "ok", or "bad: <reason>". A partial text (finish_reason
"length") must be the start of some JSON text; if it is already a whole object or array (which
nothing can extend) it must also validate. OpenAPI's `nullable: true` is read as its spec
defines it (null allowed beside `type`), since jsonschema ignores the keyword."""
import json
import re
import sys

import jsonschema

NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
WS = " \t\n\r"


def openapi_nullable(s):
    """A copy of schema s with each `nullable: true` beside a `type` made a type list with null."""
    if isinstance(s, list):
        return [openapi_nullable(x) for x in s]
    if not isinstance(s, dict):
        return s
    out = {k: openapi_nullable(v) for k, v in s.items()}
    if out.get("nullable") is True and "type" in out:
        t = out["type"]
        t = list(t) if isinstance(t, list) else [t]
        out["type"] = t if "null" in t else t + ["null"]
    return out


def prefix_error(t):
    """None when t is the start of some JSON text, else what is wrong (a JSON tokenizer with
    a stack of open containers, independent of the engine's grammar)."""
    stack, state, i, n = [], "value", 0, len(t)
    while i < n:
        c = t[i]
        if state in ("value", "value_or_close", "key", "key_or_close", "colon", "after", "done") and c in WS:
            i += 1
            continue
        if state == "done":
            return "text after the value at %d" % i
        if state in ("key", "key_or_close"):
            if c == "}" and state == "key_or_close":
                stack.pop()
                state = "after" if stack else "done"
                i += 1
                continue
            if c != '"':
                return "a key expected at %d" % i
            state, i = "string_key", i + 1
            continue
        if state == "colon":
            if c != ":":
                return "':' expected at %d" % i
            state, i = "value", i + 1
            continue
        if state == "after":
            top = stack[-1]
            if c == ",":
                state = "key" if top == "{" else "value"
            elif (c == "}" and top == "{") or (c == "]" and top == "["):
                stack.pop()
                state = "after" if stack else "done"
            else:
                return "',' or a close expected at %d" % i
            i += 1
            continue
        if state.startswith("string"):
            j = i
            while j < n and t[j] not in '"\\':
                if ord(t[j]) < 0x20:
                    return "a control character in a string at %d" % j
                j += 1
            if j == n:
                return None
            if t[j] == "\\":
                if j + 1 == n:
                    return None
                e = t[j + 1]
                if e == "u":
                    h = t[j + 2:j + 6]
                    if not re.fullmatch(r"[0-9a-fA-F]*", h):
                        return "a bad \\u escape at %d" % j
                    if len(h) < 4:
                        return None
                    i = j + 6
                elif e in '"\\/bfnrt':
                    i = j + 2
                else:
                    return "a bad escape at %d" % j
                continue
            # the closing quote
            i = j + 1
            if state == "string_key":
                state = "colon"
            else:
                state = "after" if stack else "done"
            continue
        # a value is expected
        if c == "]" and state == "value_or_close":
            stack.pop()
            state = "after" if stack else "done"
            i += 1
        elif c == "{":
            stack.append("{")
            state, i = "key_or_close", i + 1
        elif c == "[":
            stack.append("[")
            state, i = "value_or_close", i + 1
        elif c == '"':
            state, i = "string_value", i + 1
        elif c in "-0123456789":
            j = i
            while j < n and t[j] in "+-.eE0123456789":
                j += 1
            s = t[i:j]
            whole = NUMBER.fullmatch(s)
            if j == n:
                return None if whole or NUMBER.fullmatch(s + "0") else "a bad number at %d" % i
            if not whole:
                return "a bad number at %d" % i
            state, i = ("after" if stack else "done"), j
        elif c.isalpha():
            j = i
            while j < n and t[j].isalpha():
                j += 1
            w = t[i:j]
            if j == n:
                return None if any(x.startswith(w) for x in ("true", "false", "null")) else "a bad literal at %d" % i
            if w not in ("true", "false", "null"):
                return "a bad literal at %d" % i
            state, i = ("after" if stack else "done"), j
        else:
            return "a value expected at %d" % i
    return None


def check(schema, value):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    v = cls(schema, format_checker=cls.FORMAT_CHECKER)
    errs = list(v.iter_errors(value))
    return "ok" if not errs else "bad: %s" % errs[0].message.replace("\n", " ")[:200]


for item in json.load(sys.stdin):
    schema = openapi_nullable(item["schema"])
    text = item["text"]
    if item.get("partial"):
        why = prefix_error(text)
        if why:
            print("bad: the partial text is no JSON prefix: %s" % why)
            continue
        try:
            value = json.loads(text)
        except ValueError:
            print("ok")
            continue
        print(check(schema, value) if isinstance(value, (dict, list)) else "ok")
        continue
    try:
        value = json.loads(text)
    except ValueError as e:
        print("bad: does not parse: %s" % e)
        continue
    print(check(schema, value))
