"""Hugging Face `tokenizers` on GPT-2's files: the reference for data_gpt2_tokenizer_reference_test.

usage: data_gpt2_tokenizer_reference.py ENCODER_JSON VOCAB_BPE CORPUS_JSON OUT_JSON TOKENIZER_JSON

CORPUS_JSON is a JSON array of strings. OUT_JSON gets {"ids": [...], "ids_plain": [...]}: each
string's ids with "<|endoftext|>" as the special token, and with it as plain text. The tokenizer is
built as transformers' GPT2TokenizerFast converts GPT-2's files (BPE, ByteLevel pre-tokenizer
without a prefix space, <|endoftext|> added as special) and saved to TOKENIZER_JSON, so that the
test can also load a tokenizer.json that `tokenizers` itself wrote. Run with /usr/bin/python3 and
PYTHONPATH holding `tokenizers` (scripts/install-deps.sh installs it).
"""
import json
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers


def build(encoder_json, vocab_bpe, with_special):
    tokenizer = Tokenizer(models.BPE.from_file(encoder_json, vocab_bpe))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    if with_special:
        tokenizer.add_special_tokens(["<|endoftext|>"])
    return tokenizer


def main():
    encoder_json, vocab_bpe, corpus_json, out_json, tokenizer_json = sys.argv[1:6]
    with open(corpus_json, encoding="utf-8") as f:
        corpus = json.load(f)
    special = build(encoder_json, vocab_bpe, True)
    plain = build(encoder_json, vocab_bpe, False)
    special.save(tokenizer_json)
    out = {
        "ids": [e.ids for e in special.encode_batch(corpus, add_special_tokens=False)],
        "ids_plain": [e.ids for e in plain.encode_batch(corpus, add_special_tokens=False)],
    }
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
