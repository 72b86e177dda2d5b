"""Hugging Face `tokenizers` builds and runs tokenizers of both kinds: the reference for
data_hf_tokenizer_reference_test.

usage: data_hf_tokenizer_reference.py CORPUS_JSON OUT_DIR

Nothing is downloaded: each tokenizer is trained here, by `tokenizers` itself, on the corpus (a
JSON array of strings) and a little generated English, and saved as OUT_DIR/KIND/tokenizer.json
with the tokenizer_config.json and generation_config.json a Hugging Face model folder has:
  - llama3: byte-level BPE as Llama 3's file has it (Split with Llama 3's pattern, then ByteLevel
    without its regex; ignore_merges; <|begin_of_text|> put first by a TemplateProcessing), with
    added tokens that use single_word, lstrip and rstrip;
  - tinyllama: SentencePiece-style BPE as TinyLlama's (and Llama 2's) file has it: normalizer
    Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, byte_fallback with the 256 "<0xXX>"
    tokens in the vocabulary, fuse_unk, decoder Replace + ByteFallback + Fuse + Strip, <s> first;
    the alphabet is kept small so that emoji and most CJK go through byte fallback;
  - metaspace: the same model as newer conversions write it: no normalizer, a Metaspace
    pre-tokenizer with prepend_scheme "first" and no split, the Metaspace decoder.
OUT_DIR/ids.json gets, for each kind, every corpus string's ids without and with the special
tokens (add_special_tokens False and True) and `tokenizers`' decode of the former (special tokens
kept). Run with /usr/bin/python3 and PYTHONPATH holding `tokenizers` (scripts/install-deps.sh).
"""
import json
import os
import random
import sys

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the quick brown fox jumps over lazy dog shard shardline token tokenizer model layer "
         "tensor pipeline parallel data train serve weights gradient it's don't we'll they're "
         "I'm you've he'd 1234 2024 3.14 100% $5 #tag @user def return self print (x) [y] {z} "
         "café naïve résumé über straße привет мир γειά σου 你好 世界 こんにちは 안녕하세요 "
         "مرحبا नमस्ते 😀 👍 🎉").split()


def training_text(corpus):
    rng = random.Random(1234)
    lines = list(corpus)
    for _ in range(3000):
        n = rng.randint(3, 14)
        words = [rng.choice(WORDS) for _ in range(n)]
        sep = rng.choice([" ", " ", " ", "  ", "\n", ", ", ". "])
        lines.append(sep.join(words) + rng.choice(["", ".", "!", "\n", "?"]))
    return lines


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False, indent=1)


def llama3(text, out):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(text, trainer)
    tok.add_tokens([AddedToken("Shardline", single_word=True, normalized=False)])
    tok.add_special_tokens([AddedToken("<|sep|>", lstrip=True, rstrip=True, special=True)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    write_json(os.path.join(out, "tokenizer_config.json"),
               {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                "tokenizer_class": "PreTrainedTokenizerFast"})
    write_json(os.path.join(out, "generation_config.json"),
               {"bos_token_id": bos,
                "eos_token_id": [tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>")]})
    return tok


def sentencepiece_model(text):
    """Trains on "▁"-prefixed words, then builds the model as a converted SentencePiece file has
    it: <unk> <s> </s>, the 256 byte tokens, then the trained pieces."""
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(vocab_size=420, min_frequency=2, limit_alphabet=70,
                                  special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    trainer_tok.train_from_iterator(text, trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    return vocab, merges


def sentencepiece(vocab, merges, out, metaspace):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t in ["<unk>", "<s>", "</s>"]])
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                     split=False)
        tok.decoder = decoders.Sequence([
            decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False),
            decoders.ByteFallback(), decoders.Fuse()])
    else:
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([
            decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0)])
        # A non-special added token matched in the normalized text, where it is "▁shard".
        tok.add_tokens([AddedToken("shard", normalized=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    write_json(os.path.join(out, "tokenizer_config.json"),
               {"add_bos_token": True, "add_eos_token": False,
                "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False,
                              "normalized": False, "rstrip": False, "single_word": False},
                "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False,
                              "normalized": False, "rstrip": False, "single_word": False},
                "tokenizer_class": "LlamaTokenizer"})
    write_json(os.path.join(out, "generation_config.json"),
               {"bos_token_id": 1, "eos_token_id": 2, "max_length": 2048})
    return tok


def main():
    corpus_json, out_dir = sys.argv[1:3]
    with open(corpus_json, encoding="utf-8") as f:
        corpus = json.load(f)
    text = training_text(corpus)
    vocab, merges = sentencepiece_model(text)
    kinds = {
        "llama3": llama3(text, os.path.join(out_dir, "llama3")),
        "tinyllama": sentencepiece(vocab, merges, os.path.join(out_dir, "tinyllama"), False),
        "metaspace": sentencepiece(vocab, merges, os.path.join(out_dir, "metaspace"), True),
    }
    out = {}
    for name, tok in kinds.items():
        plain = [e.ids for e in tok.encode_batch(corpus, add_special_tokens=False)]
        out[name] = {
            "ids": plain,
            "ids_with_specials": [e.ids for e in tok.encode_batch(corpus, add_special_tokens=True)],
            "decoded": tok.decode_batch(plain, skip_special_tokens=False),
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        }
    write_json(os.path.join(out_dir, "ids.json"), out)


if __name__ == "__main__":
    main()
