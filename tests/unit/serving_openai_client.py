"""OpenAI's official Python client against `shardline serve`: serving_openai_client_test's checks.

usage: serving_openai_client.py --base-url URL --api-key KEY --model NAME --prompt TEXT
                                --expected TEXT --context N

URL is the server's root (http://127.0.0.1:PORT); the client gets URL + "/v1". EXPECTED is what
`shardline generate` prints after PROMPT at greedy (one byte a token: the byte tokenizer), and
its length is the max_tokens asked for; N is the model's context in tokens. Each check prints
"ok: ..." or "FAIL: ..."; the exit code is 1 when any failed. Run with /usr/bin/python3 and
PYTHONPATH holding `openai` (scripts/install-deps.sh installs it, SHARDLINE_OPENAI_CLIENT_DIR).
"""
import argparse
import sys
import traceback

import openai

failures = []


def check(condition, what, got=None):
    if condition:
        print(f"ok: {what}")
    else:
        failures.append(what)
        print(f"FAIL: {what}" + ("" if got is None else f" (got {got!r})"))


def section(fn):
    """Runs one group of checks; an exception (a status error where none was due, a malformed
    response the client could not parse) fails the group with its traceback."""
    print(f"--- {fn.__name__}")
    try:
        fn()
    except Exception:  # noqa: BLE001: any failure of the client is a failed check
        failures.append(f"{fn.__name__} raised")
        print(f"FAIL: {fn.__name__} raised:\n{traceback.format_exc()}")


def expect_status_error(what, exception_type, status, call, param=None, code=None):
    """`call` must raise `exception_type` (an openai.APIStatusError) with `status`, and the
    error's param/code when given."""
    try:
        call()
    except exception_type as e:
        check(e.status_code == status, f"{what}: HTTP status {status}", e.status_code)
        check(isinstance(e.body, dict) and bool(e.message), f"{what}: an error body and message",
              e.body)
        if param is not None:
            check(e.param == param, f"{what}: error param '{param}'", e.param)
        if code is not None:
            check(e.code == code, f"{what}: error code '{code}'", e.code)
        print(f"    ({type(e).__name__}: {e.message})")
        return
    except openai.APIError as e:
        check(False, f"{what}: raises {exception_type.__name__}", f"{type(e).__name__}: {e}")
        return
    check(False, f"{what}: raises {exception_type.__name__}", "no exception")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--expected", required=True)
    parser.add_argument("--context", type=int, required=True)
    args = parser.parse_args()
    print(f"openai {openai.__version__} from {openai.__file__}; greedy text {args.expected!r}")

    # No retries: a status the client would retry (5xx, 429) must show, not be hidden.
    client = openai.OpenAI(base_url=args.base_url + "/v1", api_key=args.api_key, max_retries=0,
                           timeout=20.0)
    model, prompt, expected = args.model, args.prompt, args.expected
    tokens = len(expected)
    prompt_tokens = len(prompt.encode())
    greedy = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0}

    def models_list():
        page = client.models.list()
        ids = [m.id for m in page.data]
        check(ids == [model], f"models.list() lists exactly '{model}'", ids)
        check(all(m.object == "model" for m in page.data), "models.list(): object 'model'")

    def completion():
        c = client.completions.create(**greedy)
        check(c.object == "text_completion", "completion: object 'text_completion'", c.object)
        check(c.id.startswith("cmpl-"), "completion: id starts with 'cmpl-'", c.id)
        check(c.model == model, f"completion: model '{model}'", c.model)
        check(len(c.choices) == 1, "completion: one choice", len(c.choices))
        choice = c.choices[0]
        check(choice.index == 0, "completion: choice index 0", choice.index)
        check(choice.text == expected, "completion: the greedy text `shardline generate` prints",
              choice.text)
        check(choice.finish_reason == "length", "completion: finish_reason 'length'",
              choice.finish_reason)
        u = c.usage
        check(u is not None and u.prompt_tokens == prompt_tokens,
              f"completion: usage.prompt_tokens {prompt_tokens}", u)
        check(u is not None and u.completion_tokens == tokens,
              f"completion: usage.completion_tokens {tokens}", u)
        check(u is not None and u.total_tokens == prompt_tokens + tokens,
              f"completion: usage.total_tokens {prompt_tokens + tokens}", u)

    def completion_stream():
        chunks = list(client.completions.create(**greedy, stream=True,
                                                stream_options={"include_usage": True}))
        # How many chunks carry the text depends on timing (a tiny model may finish before the
        # handler first looks): at least one, and the finish in a chunk of its own or the last.
        with_text = [c for c in chunks if c.choices and c.choices[0].text]
        check(len(with_text) >= 1, "completion stream: text chunks arrive", len(with_text))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        check(text == expected, "completion stream: the text joined is the non-streamed text", text)
        check(len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("cmpl-"),
              "completion stream: one id, 'cmpl-...', on every chunk", {c.id for c in chunks})
        check(all(c.object == "text_completion" for c in chunks),
              "completion stream: object 'text_completion' on every chunk")
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        check(finishes and finishes[-1] == "length" and all(f is None for f in finishes[:-1]),
              "completion stream: finish_reason 'length' on the last choice chunk only", finishes)
        last = chunks[-1] if chunks else None
        check(last is not None and last.choices == [] and last.usage is not None and
              last.usage.prompt_tokens == prompt_tokens and
              last.usage.completion_tokens == tokens,
              f"completion stream: include_usage ends with a usage chunk ({prompt_tokens}, "
              f"{tokens})", last)
        # The raw events through the client's own transport: the stream ends with [DONE].
        with client.completions.with_streaming_response.create(**greedy, stream=True) as raw:
            check(raw.headers.get("content-type", "").startswith("text/event-stream"),
                  "completion stream: Content-Type text/event-stream",
                  raw.headers.get("content-type"))
            lines = [line for line in raw.iter_lines() if line]
        check(lines and lines[-1] == "data: [DONE]", "completion stream: ends with 'data: [DONE]'",
              lines[-3:])
        check(all(line.startswith("data: ") for line in lines),
              "completion stream: every event a 'data: ' line", lines[:3])

    def completion_stop():
        # A stop string from inside the greedy text: the text ends before it, finish_reason 'stop'.
        stop = expected[4:6]
        cut = expected[:expected.find(stop)]
        c = client.completions.create(**greedy, stop=[stop, "never seen"])
        check(c.choices[0].text == cut, f"completion with stop {stop!r}: the text before it",
              c.choices[0].text)
        check(c.choices[0].finish_reason == "stop", "completion with stop: finish_reason 'stop'",
              c.choices[0].finish_reason)
        chunks = list(client.completions.create(**greedy, stop=stop, stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        check(text == cut, f"completion stream with stop {stop!r}: the text before it", text)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        check(finishes and finishes[-1] == "stop",
              "completion stream with stop: the last finish_reason 'stop'", finishes)

    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "say something"}]
    chat_tokens = 10
    chat_args = {"model": model, "messages": messages, "max_tokens": chat_tokens,
                 "temperature": 0}
    chat_content = []

    def chat():
        c = client.chat.completions.create(**chat_args)
        check(c.object == "chat.completion", "chat: object 'chat.completion'", c.object)
        check(c.id.startswith("chatcmpl-"), "chat: id starts with 'chatcmpl-'", c.id)
        check(c.model == model, f"chat: model '{model}'", c.model)
        check(len(c.choices) == 1, "chat: one choice", len(c.choices))
        m = c.choices[0].message
        check(m.role == "assistant", "chat: message role 'assistant'", m.role)
        check(isinstance(m.content, str) and len(m.content) == chat_tokens,
              f"chat: content of {chat_tokens} characters (one byte a token)", m.content)
        check(c.choices[0].finish_reason == "length", "chat: finish_reason 'length'",
              c.choices[0].finish_reason)
        u = c.usage
        check(u is not None and u.completion_tokens == chat_tokens and
              u.prompt_tokens > sum(len(x["content"]) for x in messages) and
              u.total_tokens == u.prompt_tokens + u.completion_tokens,
              f"chat: usage counts the messages and {chat_tokens} completion tokens", u)
        chat_content.append(m.content)
        # The client's newer name for max_tokens.
        c = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                           max_completion_tokens=chat_tokens)
        check(c.choices[0].message.content == m.content and c.usage.completion_tokens == chat_tokens,
              "chat with max_completion_tokens: the same content", c.choices[0].message.content)

    def chat_stream():
        chunks = list(client.chat.completions.create(**chat_args, stream=True,
                                                     stream_options={"include_usage": True}))
        usage = chunks.pop() if chunks and not chunks[-1].choices else None
        check(usage is not None and usage.usage is not None and
              usage.usage.completion_tokens == chat_tokens,
              f"chat stream: include_usage ends with a usage chunk ({chat_tokens} tokens)", usage)
        check(chunks and chunks[0].choices[0].delta.role == "assistant",
              "chat stream: the first delta has role 'assistant'", chunks[:1])
        check(all(c.object == "chat.completion.chunk" for c in chunks),
              "chat stream: object 'chat.completion.chunk' on every chunk")
        check(len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-"),
              "chat stream: one id, 'chatcmpl-...', on every chunk", {c.id for c in chunks})
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        check(chat_content and text == chat_content[0],
              "chat stream: the deltas joined are the non-streamed content", text)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        check(finishes and finishes[-1] == "length" and all(f is None for f in finishes[:-1]),
              "chat stream: finish_reason 'length' on the last chunk only", finishes)

    def errors():
        expect_status_error(
            "max_tokens past the context", openai.BadRequestError, 400,
            lambda: client.completions.create(**{**greedy, "max_tokens": args.context}),
            param="max_tokens")
        expect_status_error(
            "temperature -1", openai.BadRequestError, 400,
            lambda: client.completions.create(**{**greedy, "temperature": -1}),
            param="temperature")
        expect_status_error(
            "chat temperature -1, streamed", openai.BadRequestError, 400,
            lambda: list(client.chat.completions.create(**{**chat_args, "temperature": -1},
                                                        stream=True)),
            param="temperature")
        expect_status_error(
            "a prompt as long as the context", openai.BadRequestError, 400,
            lambda: client.completions.create(**{**greedy, "prompt": "a" * args.context,
                                                 "max_tokens": 1}),
            param="prompt")
        expect_status_error(
            "a wrong model name", openai.NotFoundError, 404,
            lambda: client.completions.create(**{**greedy, "model": model + "-nope"}),
            param="model", code="model_not_found")
        expect_status_error(
            "a wrong model name in chat", openai.NotFoundError, 404,
            lambda: client.chat.completions.create(**{**chat_args, "model": model + "-nope"}),
            code="model_not_found")
        wrong_key = openai.OpenAI(base_url=args.base_url + "/v1", api_key=args.api_key + "x",
                                  max_retries=0, timeout=20.0)
        expect_status_error("a wrong API key", openai.AuthenticationError, 401,
                            lambda: wrong_key.completions.create(**greedy),
                            code="invalid_api_key")
        expect_status_error("a wrong API key on models.list", openai.AuthenticationError, 401,
                            lambda: wrong_key.models.list())

    for fn in (models_list, completion, completion_stream, completion_stop, chat, chat_stream,
               errors):
        section(fn)
    if failures:
        print(f"{len(failures)} check(s) failed: " + "; ".join(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
