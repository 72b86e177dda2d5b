"""Renders chat templates as transformers' apply_chat_template(tokenize=False) does, for
tests/unit/serving_chat_template_test.cc: Python's jinja2 in an ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, loopcontrols, raise_exception, strftime_now and transformers' tojson,
given the messages, add_generation_prompt, tools=None, documents=None and the config's special
tokens (strings, or AddedToken objects' content; null ones left out).

Usage: serving_chat_template_reference.py CASES OUT. CASES is a JSON list of
{"config": PATH, "messages": [...], "add_generation_prompt": bool}; OUT gets a JSON list of
{"text": ...} or {"error": ...}, one per case. Run with /usr/bin/python3 (Debian's python3-jinja2)."""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def template_and_tokens(path):
    with open(path) as f:
        config = json.load(f)
    tokens = {}
    for name in SPECIAL_TOKENS:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None:
            tokens[name] = value
    jinja_file = os.path.join(os.path.dirname(path), "chat_template.jinja")
    if os.path.exists(jinja_file):
        with open(jinja_file) as f:
            return f.read(), tokens
    template = config["chat_template"]
    if isinstance(template, list):
        template = {t["name"]: t["template"] for t in template}["default"]
    return template, tokens


def main():
    env = environment()
    out = []
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    for case in cases:
        source, tokens = template_and_tokens(case["config"])
        try:
            text = env.from_string(source).render(
                messages=case["messages"], tools=None, documents=None,
                add_generation_prompt=case["add_generation_prompt"], **tokens)
            out.append({"text": text})
        except jinja2.exceptions.TemplateError as e:
            out.append({"error": str(e)})
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
