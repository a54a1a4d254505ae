"""
Prepares training data: token shards and the tokenizer file.

  /usr/bin/python3 data/prepare.py                 Jane Austen's six novels (default; offline)
  /usr/bin/python3 data/prepare.py --corpus tinyshakespeare   (downloads ~1 MB of text; needs the internet)
  options: --force (rebuild even if up to date), --out-dir DIR (default: this folder)

Default corpus: the six novels as shipped by the Debian package r-cran-janeaustenr. Its text sits in
an R data base (Rdata.rdx/.rdb) that r_serialize.py reads without R. If the package is not installed,
its .deb is fetched with `apt-get download` into data/.cache and unpacked there (no R is installed).

Each chapter is one document (front matter and volume headings go with the chapter that follows
them); every document starts with <|endoftext|> (50256). Every 20th chapter (chapters 20, 40, ...
counted across the novels in publication order) is held out for validation, so validation text is
spread over all six novels.

Outputs (llm.c's formats, see README.md): <name>_train.bin, <name>_val.bin, gpt2_tokenizer.bin.
A second run is instant when the outputs are newer than every input.
"""

import argparse
import array
import glob
import os
import re
import struct
import subprocess
import sys
import time

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, DATA_DIR)

import gpt2_bpe  # noqa: E402
import r_serialize  # noqa: E402

SHARD_MAGIC, SHARD_VERSION = 20240520, 1
TOKENIZER_MAGIC, TOKENIZER_VERSION = 20240328, 2
HEADER_INTS = 256

AUSTEN_PACKAGE = "r-cran-janeaustenr"
AUSTEN_DATA_SUBDIR = "usr/lib/R/site-library/janeaustenr/data"
# publication order; the names are the package's variable names
AUSTEN_NOVELS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion"]
VALIDATION_EVERY = 20

TINYSHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"


def write_atomically(path, chunks):
    temporary = path + ".tmp"
    with open(temporary, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
    os.replace(temporary, path)


def write_shard(path, tokens):
    if any(t >= gpt2_bpe.VOCAB_SIZE for t in tokens):
        raise ValueError("token id out of range")
    header = array.array("i", [0] * HEADER_INTS)
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, len(tokens)
    body = array.array("H", tokens)
    if sys.byteorder != "little":
        header.byteswap()
        body.byteswap()
    write_atomically(path, [header.tobytes(), body.tobytes()])


def shard_token_count(path):
    with open(path, "rb") as f:
        magic, version, count = struct.unpack("<3i", f.read(12))
    return count if (magic, version) == (SHARD_MAGIC, SHARD_VERSION) else -1


def write_tokenizer(path, tokenizer):
    header = array.array("i", [0] * HEADER_INTS)
    header[0], header[1] = TOKENIZER_MAGIC, TOKENIZER_VERSION
    header[2], header[3] = gpt2_bpe.VOCAB_SIZE, gpt2_bpe.END_OF_TEXT_ID
    if sys.byteorder != "little":
        header.byteswap()
    chunks = [header.tobytes()]
    for token in tokenizer.token_bytes:
        if not 1 <= len(token) <= 255:
            raise ValueError(f"token of {len(token)} bytes does not fit the tokenizer file")
        chunks.append(bytes([len(token)]) + token)
    write_atomically(path, chunks)


# ---------------------------------------------------------------------------------------------------
# Jane Austen

def find_austen_data():
    """Returns (rdx, rdb) paths of the package's data base, fetching the .deb if it is not installed."""
    for root in ("/", os.path.join(DATA_DIR, ".cache", AUSTEN_PACKAGE)):
        folder = os.path.join(root, AUSTEN_DATA_SUBDIR)
        rdx, rdb = os.path.join(folder, "Rdata.rdx"), os.path.join(folder, "Rdata.rdb")
        if os.path.exists(rdx) and os.path.exists(rdb):
            return rdx, rdb
    cache = os.path.join(DATA_DIR, ".cache")
    os.makedirs(cache, exist_ok=True)
    print(f"{AUSTEN_PACKAGE} is not installed: fetching its .deb into {cache}")
    try:
        for old in glob.glob(os.path.join(cache, f"{AUSTEN_PACKAGE}_*.deb")):
            os.remove(old)
        subprocess.run(["apt-get", "download", AUSTEN_PACKAGE], cwd=cache, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        debs = glob.glob(os.path.join(cache, f"{AUSTEN_PACKAGE}_*.deb"))
        if not debs:
            raise OSError("apt-get download produced no .deb")
        subprocess.run(["dpkg-deb", "-x", debs[0], os.path.join(cache, AUSTEN_PACKAGE)], check=True)
    except (OSError, subprocess.CalledProcessError) as problem:
        sys.exit(f"error: cannot get {AUSTEN_PACKAGE} (install it with apt-get, or run apt-get update first): "
                 f"{problem}")
    return find_austen_data()


CHAPTER_HEADING = re.compile(r"^\s*chapter\s+([ivxlc]+|\d+)\b", re.IGNORECASE)
VOLUME_HEADING = re.compile(r"^\s*volume\s+([ivxlc]+|\d+)\b", re.IGNORECASE)


def split_chapters(lines):
    """Splits a novel (list of lines) into chapters. A volume heading just before a chapter heading
    belongs to that chapter; text before the first chapter (title, author) belongs to the first."""
    starts = []
    for i, line in enumerate(lines):
        if CHAPTER_HEADING.match(line):
            start = i
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            if j >= 0 and VOLUME_HEADING.match(lines[j]):
                start = j
            starts.append(start)
    if not starts:
        raise ValueError("novel without chapter headings")
    starts[0] = 0
    bounds = starts + [len(lines)]
    return ["\n".join(lines[a:b]).strip("\n") for a, b in zip(bounds, bounds[1:])]


def austen_documents():
    rdx, rdb = find_austen_data()
    novels = r_serialize.read_lazyload_db(rdx, rdb)
    missing = [name for name in AUSTEN_NOVELS if name not in novels]
    if missing:
        sys.exit(f"error: {rdb} lacks the novels {missing}")
    documents = []
    for name in AUSTEN_NOVELS:
        documents.extend(split_chapters(list(novels[name])))
    return documents, [rdx, rdb]


# ---------------------------------------------------------------------------------------------------
# tiny Shakespeare (optional, online)

def tinyshakespeare_documents():
    path = os.path.join(DATA_DIR, ".cache", "tinyshakespeare.txt")
    if not os.path.exists(path):
        import urllib.request
        os.makedirs(os.path.dirname(path), exist_ok=True)
        print(f"downloading {TINYSHAKESPEARE_URL}")
        try:
            with urllib.request.urlopen(TINYSHAKESPEARE_URL, timeout=60) as response:
                text = response.read()
        except OSError as problem:
            sys.exit(f"error: cannot download tiny Shakespeare: {problem}")
        write_atomically(path, [text])
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # each speech (separated by blank lines) is one document
    return [speech for speech in text.split("\n\n") if speech.strip()], [path]


# ---------------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description="Tokenize a corpus into llm.c token shards.")
    parser.add_argument("--corpus", choices=["austen", "tinyshakespeare"], default="austen")
    parser.add_argument("--out-dir", default=DATA_DIR)
    parser.add_argument("--force", action="store_true", help="rebuild even if the outputs are up to date")
    args = parser.parse_args()

    started = time.time()
    os.makedirs(args.out_dir, exist_ok=True)
    train_path = os.path.join(args.out_dir, f"{args.corpus}_train.bin")
    val_path = os.path.join(args.out_dir, f"{args.corpus}_val.bin")
    tokenizer_path = os.path.join(args.out_dir, "gpt2_tokenizer.bin")
    outputs = [train_path, val_path, tokenizer_path]

    package_dir = gpt2_bpe.ensure_vocabulary_files()
    code = [os.path.join(DATA_DIR, name) for name in ("prepare.py", "gpt2_bpe.py", "r_serialize.py")]
    vocabulary = [os.path.join(package_dir, name) for name in ("encoder.json", "vocab.bpe")]
    if args.corpus == "austen":
        rdx, rdb = find_austen_data()
        corpus_inputs = [rdx, rdb]
    else:
        corpus_inputs = [os.path.join(DATA_DIR, ".cache", "tinyshakespeare.txt")]
    inputs = code + vocabulary + corpus_inputs
    if not args.force and all(os.path.exists(p) for p in outputs + inputs):
        newest_input = max(os.path.getmtime(p) for p in inputs)
        if min(os.path.getmtime(p) for p in outputs) > newest_input:
            print(f"up to date: {train_path} ({shard_token_count(train_path)} tokens), "
                  f"{val_path} ({shard_token_count(val_path)} tokens), {tokenizer_path}")
            return

    tokenizer = gpt2_bpe.GPT2Tokenizer(package_dir)
    documents, _ = austen_documents() if args.corpus == "austen" else tinyshakespeare_documents()
    train, val = [], []
    val_documents = 0
    for index, document in enumerate(documents):
        held_out = (index + 1) % VALIDATION_EVERY == 0
        if args.corpus == "tinyshakespeare":
            held_out = index < len(documents) // 10  # the first tenth, as one contiguous stretch
        target = val if held_out else train
        val_documents += held_out
        target.append(gpt2_bpe.END_OF_TEXT_ID)
        target.extend(tokenizer.encode(document))
    write_shard(train_path, train)
    write_shard(val_path, val)
    write_tokenizer(tokenizer_path, tokenizer)
    characters = sum(len(d) for d in documents)
    print(f"{args.corpus}: {len(documents)} documents, {characters} characters")
    print(f"wrote {train_path}: {len(documents) - val_documents} documents, {len(train)} tokens")
    print(f"wrote {val_path}: {val_documents} documents, {len(val)} tokens")
    print(f"wrote {tokenizer_path}: {gpt2_bpe.VOCAB_SIZE} tokens")
    print(f"took {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
