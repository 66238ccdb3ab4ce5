#!/usr/bin/env python3
"""Makes the byte-level BPE parity fixtures under tests/fixtures/bpe/ with HF `tokenizers`.

Two small tokenizer.json files, trained here with exactly the pre-tokenizers, normalizers,
decoders, post-processors and special tokens of the real models (only the vocabulary is small):
  llama3/   Meta-Llama-3's: no normalizer; Split on the Llama 3 regex (digits in runs of 1-3)
            then ByteLevel without regex; BPE with ignore_merges, and 150 whole words in the
            vocabulary that the merges do not reach (as in Llama 3's vocabulary, which
            ignore_merges then makes single tokens); the 256 special tokens
            <|begin_of_text|> .. <|reserved_special_token_250|> after the vocabulary; bos added
            by a TemplateProcessing post-processor; merges stored as "a b" strings (the
            format of the files on the Hub)
  qwen2/    Qwen2's: NFC normalizer; Split on the Qwen2 regex (single digits) then ByteLevel;
            BPE without ignore_merges; <|endoftext|>, <|im_start|>, <|im_end|> (special) and
            three of Qwen2.5's non-special added tokens (<tool_call>, </tool_call>,
            <|fim_prefix|>); merges stored as ["a", "b"] pairs (tokenizers' newer format)
each with a tokenizer_config.json naming bos and eos as transformers' files do.

mixed.txt: LINES lines of mixed text (prose, code, numbers, whitespace runs of every Unicode
space, CJK, emoji with ZWJ and flags, combining marks, special-token strings whole and
broken, control characters, invalid UTF-8), one per line, raw bytes.

For each tokenizer NAME:
  NAME.ids          line i: the ids of line i of mixed.txt, space-separated. The line is
                    decoded with bytes.decode("utf-8", errors="replace") first: transformers
                    tokenizers take Python str, so bytes that are not UTF-8 must be decoded
                    before they are tokenized, and this is what `open(..., errors="replace")`
                    and `datasets`' text loader with encoding_errors="replace" do (and what
                    the ByteLevel decoder itself does on the way out: String::from_utf8_lossy,
                    the same U+FFFD per maximal invalid subpart). Encoded with
                    add_special_tokens=False (frugal adds bos itself).
  NAME.decoded.jsonl  {"line": i, "text": decode(ids, skip_special_tokens=True)} for every line
                    whose decode differs from its raw bytes (invalid UTF-8 replaced, NFC,
                    special tokens dropped); every other line decodes to itself.
  NAME.edge.json    edge cases built from short recipes (prefix + unit * times + suffix): the
                    empty string, only special tokens, a 200,000-space run, mixed whitespace
                    runs, a 1 MB line; for each the number of ids, their FNV-1a 64 hash (over
                    each id as 4 little-endian bytes), the first and last 64 ids, and the
                    length and FNV-1a 64 hash of decode(ids, skip_special_tokens=True).

Code points whose Unicode properties differ between Oniguruma (tokenizers' regex engine,
Unicode 16) and PCRE2 10.42 (Unicode 14) are not drawn: see doc/hf-interop.md.

Run (not in CI: CI has no Python peers):
  /work/venv/bin/python tools/make_bpe_fixtures.py [--out tests/fixtures/bpe]
"""

import argparse
import json
import os
import random

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

LINES = 10240

# The Split patterns of the published tokenizer.json files, verbatim.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def llama3_special_tokens():
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
             "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
             "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|reserved_special_token_4|>", "<|eot_id|>"]
    names += [f"<|reserved_special_token_{i}|>" for i in range(5, 251)]
    assert len(names) == 256
    return names


QWEN2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_PLAIN_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>"]

# --- the text generator ---------------------------------------------------------------------

WORDS = ("the of and to in is was he for it with as his on be at by had are but from or "
         "have an they which one you were all her she there would their we him been has when "
         "who will no more if out so said what up its about than into them can only other "
         "time new some could these two may first then do any like my now over such our man "
         "me even most made after also did many before must through back years where much "
         "your way well down should because each just those people how too little state good "
         "very make world still own see men work long get here between both life being under "
         "never day same another know while last might us great old year off come since "
         "against go came right used take three tokenizer merges Unicode byte-level BPE "
         "Llama Qwen transformer gradient shard").split()
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL",
                "'D", "'x", "\u017fs", "'\u017f"]  # U+017F long s case-folds to s
# Every character Oniguruma's \s matches (U+180E is left out: see the docstring).
SPACES = ["\t", "\n", "\x0b", "\x0c", "\r", " ", "\x85", "\xa0", "\u1680"] + \
    [chr(c) for c in range(0x2000, 0x200B)] + ["\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
# Not \s but near it: zero-width characters, BOM.
NEAR_SPACES = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"]
CODE = [
    "for (int i = 0; i < n; ++i) {", "    x[i] += y[i] * 0.5f;", "}", "\tif (a != b) return -1;",
    "def f(x, *args, **kw):", "    return {'a': [1, 2, 3], \"b\": None}",
    "#include <vector>", "std::vector<int32_t> ids{128000, 9906};", "x = y if z else w  # why",
    "SELECT id, name FROM t WHERE x >= 42 AND y <> 'q';", "fn main() -> Result<(), Box<dyn Error>> {",
    "const re = /^\\s+(?!\\S)|[\\r\\n]+$/gu;", "a&&b||!c", "i++; j--; k <<= 2; m >>= 3;",
    "<div class=\"x\">&amp;&lt;&gt;</div>", "$ echo \"$HOME\" | grep -E '^/root' >/dev/null 2>&1",
    "    \"\"\"Docstring with 'quotes'.\"\"\"", "print(f\"{x!r:>10}\")", "@@ -1,4 +1,5 @@",
]
NUMBERS = ["0", "7", "42", "123", "1234", "12345", "3.14159", "2.71828e-10", "1,234,567",
           "0xDEADBEEF", "1e100", "-0.0", "100%", "$19.99", "\u0661\u0662\u0663", "\uff11\uff12\uff13",
           "\u00b2", "\u00bd", "\u2167", "\u2460", "\u0967\u0968", "2024-06-30", "12:34:56",
           "9" * 17, "3\u00a0000", "\u3007"]
CJK = ("\u4eca\u65e5\u306f\u826f\u3044\u5929\u6c17\u3067\u3059\u306d\u3002"
       "\u6211\u4eec\u5728\u8bad\u7ec3\u4e00\u4e2a\u5c0f\u6a21\u578b\uff0c\u7528\u4e8e\u6d4b\u8bd5\u3002"
       "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\ub3c4 \uc788\uc2b5\ub2c8\ub2e4. "
       "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3001\u6f22\u5b57\u3002"
       "\u300c\u5f15\u7528\u300d\u3010\u62ec\u5f27\u3011\uff08\u5168\u89d2\uff09")
OTHER_SCRIPTS = ["\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac", "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u044f\u0437\u044b\u043a",
                 "\u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\u05e2\u05d1\u05e8\u05d9\u05ea",
                 "\u0939\u093f\u0928\u094d\u0926\u0940", "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
                 "na\u00efve caf\u00e9 d\u00e9j\u00e0 vu", "Stra\u00dfe \u00c4\u00d6\u00dc",
                 "\u0130stanbul \u0131", "\u1e9e\u00df", "\ufb01\ufb02"]
# Decomposed forms NFC composes (Qwen2) and Llama 3 keeps.
COMBINING = ["e\u0301", "A\u030a", "n\u0303", "\u1100\u1161\u11a8", "o\u0308\u0304", "\u212b",
             "\u2126", "a\u0323\u0307", "\u0915\u093c", "x\u0301\u0302"]
EMOJI = ["\U0001f600", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
         "\U0001f1eb\U0001f1f7", "\u2764\ufe0f", "\U0001f9d1\u200d\U0001f4bb", "\u263a",
         "\U0001f680\U0001f680\U0001f680", "#\ufe0f\u20e3", "\U0001f3f3\ufe0f\u200d\U0001f308"]
PUNCT = list(".,;:!?-()[]{}<>/\\|@#$%^&*_+=~`\"'") + ["...", "--", "\u2014", "\u2026", "\u00ab\u00bb",
                                                     "\u201c\u201d", "\u00bf", "\u00a1"]
CONTROL = ["\x00", "\x01", "\x1b[0m", "\x7f", "\x1f", "\u0080", "\u009f"]
INVALID = [b"\xff", b"\xfe", b"\x80", b"\xbf\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf",
           b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80",
           b"\xf8\x88\x80\x80\x80", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xe2\x28\xa1",
           b"\xf0\x28\x8c\xbc", b"\xc3\x28", b"\xe1\x80\xe2\x80\xa0"]


def specials_text(rng, specials):
    s = rng.choice(specials)
    r = rng.random()
    if r < 0.3:
        return s[:-1]  # broken: must not match
    if r < 0.4:
        return s[1:]
    if r < 0.5:
        return s + s  # adjacent
    return s


def piece(rng, specials):
    r = rng.random()
    if r < 0.30:
        w = rng.choice(WORDS)
        if rng.random() < 0.2:
            w = w.capitalize() if rng.random() < 0.5 else w.upper()
        if rng.random() < 0.1:
            w += rng.choice(CONTRACTIONS)
        return w
    if r < 0.40:
        return rng.choice(NUMBERS) if rng.random() < 0.6 else str(rng.randrange(10 ** rng.randrange(1, 12)))
    if r < 0.47:
        return rng.choice(PUNCT)
    if r < 0.55:
        n = rng.choice([1, 1, 2, 3, 4, 7, 16, 33])
        return "".join(rng.choice(SPACES[:6] if rng.random() < 0.7 else SPACES) for _ in range(n))
    if r < 0.61:
        i = rng.randrange(len(CJK))
        return CJK[i:i + rng.randrange(1, 12)]
    if r < 0.66:
        return rng.choice(EMOJI)
    if r < 0.71:
        return rng.choice(OTHER_SCRIPTS)
    if r < 0.75:
        return rng.choice(COMBINING)
    if r < 0.78:
        return specials_text(rng, specials)
    if r < 0.80:
        return rng.choice(CONTROL)
    if r < 0.81:
        return rng.choice(NEAR_SPACES)
    if r < 0.84:
        # A random code point from blocks whose properties agree between the two engines.
        lo, hi = rng.choice([(0x20, 0x7e), (0xa1, 0x24f), (0x370, 0x52f), (0x2000, 0x206f),
                             (0x2100, 0x2bff), (0x3040, 0x30ff), (0x4e00, 0x9fff),
                             (0xac00, 0xd7a3), (0x1f300, 0x1f5ff)])
        return chr(rng.randint(lo, hi))
    return " " + rng.choice(WORDS)


def make_line(rng, specials):
    kind = rng.random()
    if kind < 0.03:
        return b""
    if kind < 0.15:
        line = rng.choice(CODE)
        if rng.random() < 0.3:
            line = rng.choice(["  ", "\t", "        ", "\t\t"]) + line
        return line.encode()
    parts = []
    for _ in range(rng.randrange(1, 18)):
        p = piece(rng, specials)
        if rng.random() < 0.6 and parts and not p.startswith(" "):
            p = " " + p
        parts.append(p.encode("utf-8", "surrogatepass"))
    if rng.random() < 0.08:
        parts.insert(rng.randrange(len(parts) + 1), rng.choice(INVALID))
    if rng.random() < 0.1:
        parts.append(rng.choice([b" ", b"  ", b"\t", b"\r", b" \r"]))  # trailing whitespace
    line = b"".join(parts)
    return line.replace(b"\n", b"\\n")  # one line per text line


def make_lines(seed, n, specials):
    rng = random.Random(seed)
    return [make_line(rng, specials) for _ in range(n)]


# --- the tokenizers -------------------------------------------------------------------------

def build(kind, corpus, vocab_size):
    if kind == "llama3":
        model = models.BPE(ignore_merges=True)
        pattern, specials, plain = LLAMA3_PATTERN, llama3_special_tokens(), []
    else:
        model = models.BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                           fuse_unk=False, byte_fallback=False)
        pattern, specials, plain = QWEN2_PATTERN, QWEN2_SPECIAL, QWEN2_PLAIN_ADDED
    tok = Tokenizer(model)
    if kind == "qwen2":
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=kind == "llama3",
                                 use_regex=False)])
    if kind == "llama3":
        tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    else:
        tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                         use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    if kind == "llama3":
        tok = add_whole_words(tok, corpus)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if plain:
        tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in plain])
    if kind == "llama3":
        bos = specials[0]
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                          special_tokens=[(bos, tok.token_to_id(bos))])])
    else:
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                  use_regex=False)
    j = json.loads(tok.to_str())
    if kind == "llama3":
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    # Reloading checks the file is what tokenizers itself reads.
    tok = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
    assert json.loads(tok.to_str())["model"]["ignore_merges"] == (kind == "llama3")
    config = ({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"} if kind == "llama3"
              else {"bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"})
    config["tokenizer_class"] = "PreTrainedTokenizerFast" if kind == "llama3" else "Qwen2Tokenizer"
    return tok, j, config


def add_whole_words(tok, corpus):
    """Adds to the vocabulary (not the merges) the byte-level spelling of frequent words the
    merges split, as Llama 3's vocabulary (converted from tiktoken ranks) holds tokens its
    merges do not reach: with ignore_merges these words become one token."""
    j = json.loads(tok.to_str())
    vocab = j["model"]["vocab"]
    spell = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    words = sorted({w for line in corpus[:5000] for w in line.split(" ")
                    if 4 <= len(w) <= 12 and w.isalpha()})
    added = 0
    for w in [" " + w for w in words] + words:
        byte_level = spell.pre_tokenize_str(w)[0][0]
        if byte_level not in vocab and len(tok.encode(w).ids) > 1:
            vocab[byte_level] = len(vocab)
            added += 1
        if added == 150:
            break
    assert added == 150, added
    return Tokenizer.from_str(json.dumps(j))


def fnv1a64_bytes(data, h=0xcbf29ce484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return h


def fnv1a64(ids):
    return fnv1a64_bytes(b"".join(int(i).to_bytes(4, "little") for i in ids))


def edge_cases(specials):
    unit_1mb = ("The quick brown \U0001f98a jumps over 13,370 lazy \u72ac\u3002 "
                "x += 42;\tcaf\u00e9  \u00a0\u3000 <|endoftext|> it's ")
    times_1mb = (1 << 20) // len(unit_1mb.encode()) + 1
    return [
        {"name": "empty", "prefix": "", "unit": "", "times": 0, "suffix": ""},
        {"name": "only special tokens", "prefix": "", "unit": "".join(specials[:3]), "times": 3,
         "suffix": ""},
        {"name": "200000 spaces between words", "prefix": "a", "unit": " ", "times": 200000,
         "suffix": "b"},
        {"name": "trailing whitespace run", "prefix": "end", "unit": " \t", "times": 50000,
         "suffix": ""},
        {"name": "mixed whitespace run with newlines", "prefix": "x",
         "unit": " \u3000\r\n\u00a0\t\n", "times": 20000, "suffix": "y"},
        {"name": "1 MB line", "prefix": "", "unit": unit_1mb, "times": times_1mb, "suffix": "!"},
        {"name": "long digit run", "prefix": "", "unit": "0123456789", "times": 10000, "suffix": ""},
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/bpe")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    all_specials = llama3_special_tokens()[:10] + QWEN2_SPECIAL + QWEN2_PLAIN_ADDED
    lines = make_lines(20, LINES, all_specials)
    with open(os.path.join(args.out, "mixed.txt"), "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    corpus = [l.decode("utf-8", "replace") for l in make_lines(1234, 60000, all_specials)]

    for kind, vocab in [("llama3", 3000), ("qwen2", 3000)]:
        tok, j, config = build(kind, corpus, vocab)
        d = os.path.join(args.out, kind)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, indent=None, separators=(",", ":"))
            f.write("\n")
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        texts = [l.decode("utf-8", "replace") for l in lines]
        encodings = tok.encode_batch(texts, add_special_tokens=False)
        n_ids = 0
        with open(os.path.join(args.out, f"{kind}.ids"), "w") as f:
            for e in encodings:
                f.write(" ".join(map(str, e.ids)) + "\n")
                n_ids += len(e.ids)
        n_diff = 0
        with open(os.path.join(args.out, f"{kind}.decoded.jsonl"), "w", encoding="utf-8") as f:
            for i, (raw, e) in enumerate(zip(lines, encodings)):
                decoded = tok.decode(e.ids, skip_special_tokens=True)
                if decoded.encode() != raw:
                    f.write(json.dumps({"line": i, "text": decoded}, ensure_ascii=False) + "\n")
                    n_diff += 1
        specials = [t.content for t in tok.get_added_tokens_decoder().values() if t.special]
        edges = []
        for case in edge_cases(specials):
            text = case["prefix"] + case["unit"] * case["times"] + case["suffix"]
            ids = tok.encode(text, add_special_tokens=False).ids
            decoded = tok.decode(ids, skip_special_tokens=True).encode()
            edges.append(dict(case, count=len(ids), fnv1a64=f"{fnv1a64(ids):016x}",
                              first=ids[:64], last=ids[-64:],
                              decoded_bytes=len(decoded),
                              decoded_fnv1a64=f"{fnv1a64_bytes(decoded):016x}"))
        with open(os.path.join(args.out, f"{kind}.edge.json"), "w", encoding="utf-8") as f:
            json.dump(edges, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{kind}: vocab {tok.get_vocab_size()}, {len(lines)} lines, {n_ids} ids, "
              f"{n_diff} lines decode to other text; edge counts "
              f"{[e['count'] for e in edges]}")


if __name__ == "__main__":
    main()
