"""
A reader for R's serialization format (the XDR variant), enough to load the character vectors of an R
package's lazy-load data base without R.

An R package that ships data keeps it in data/Rdata.rdx (the index) and data/Rdata.rdb (the objects):
  - Rdata.rdx is a gzip file holding one serialized list: variables = a named list of (offset, length)
    pairs into the .rdb, references, compressed.
  - each object in Rdata.rdb, at its offset, is a 4-byte big-endian uncompressed length followed by a
    zlib stream (compressed = TRUE; 2 would mean bzip2, 3 xz) of one serialized object.

A serialized object: "X\n", then big-endian int32 format version (2 or 3), the writer's R version, the
oldest R that can read it, and (version 3 only) the native encoding as a length-prefixed string. Then
one item, recursively: an int32 of flags whose low byte is the type (SEXPTYPE), bit 8 "is object",
bit 9 "has attributes", bit 10 "has tag", bits 12..27 the "levels" (for strings: the encoding); the
flags are followed by the type's payload. Only what plain data needs is implemented; anything else
raises ValueError naming the type.
"""

import bz2
import gzip
import lzma
import struct
import zlib

# SEXPTYPE codes, and the pseudo-types used only in serialized streams
NILSXP, SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 0, 1, 2, 3, 4, 5, 6
CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP, DOTSXP = 9, 10, 13, 14, 15, 16, 17
VECSXP, EXPRSXP, RAWSXP, S4SXP = 19, 20, 24, 25
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, UNBOUNDVALUE_SXP, MISSINGARG_SXP = 255, 254, 253, 252, 251
BASENAMESPACE_SXP, NAMESPACESXP, PACKAGESXP, EMPTYENV_SXP, BASEENV_SXP = 250, 249, 248, 242, 241
ATTRLANGSXP, ATTRLISTSXP, ALTREP_SXP = 240, 239, 238

NA_INTEGER = -(2**31)


class RVector(list):
    """An R vector: a Python list of its elements plus R's attributes (names, class, ...)."""

    def __init__(self, items=(), attributes=None):
        super().__init__(items)
        self.attributes = attributes or {}


class RSymbol(str):
    pass


class _Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0
        self.references = []  # symbols and environments, referred to later by index (REFSXP)

    def take(self, count):
        if self.pos + count > len(self.data):
            raise ValueError("serialized R data ends early")
        chunk = self.data[self.pos:self.pos + count]
        self.pos += count
        return chunk

    def int32(self):
        return struct.unpack(">i", self.take(4))[0]

    def length(self):
        n = self.int32()
        if n == -1:  # long vector: two more ints give the upper and lower 32 bits
            upper, lower = self.int32(), self.int32()
            n = (upper << 32) + (lower & 0xFFFFFFFF)
        return n

    def header(self):
        if self.take(2) != b"X\n":
            raise ValueError("not XDR-format R serialization")
        version = self.int32()
        self.int32()  # R version that wrote it
        self.int32()  # oldest R version that reads it
        if version == 3:
            self.take(self.int32())  # native encoding name
        elif version != 2:
            raise ValueError(f"unsupported R serialization version {version}")

    def attributes(self, has_attributes):
        if not has_attributes:
            return {}
        pairlist = self.item()
        return dict(pairlist) if isinstance(pairlist, list) else {}

    def charsxp(self, levels):
        n = self.int32()
        if n == -1:
            return None  # NA_character_
        raw = self.take(n)
        latin1 = levels & (1 << 2)
        return raw.decode("latin-1" if latin1 else "utf-8")

    def item(self):
        flags = self.int32()
        kind = flags & 0xFF
        levels = flags >> 12
        has_attributes = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))

        if kind in (NILVALUE_SXP, NILSXP):
            return None
        if kind in (GLOBALENV_SXP, EMPTYENV_SXP, BASEENV_SXP, BASENAMESPACE_SXP, UNBOUNDVALUE_SXP,
                    MISSINGARG_SXP):
            return ("special", kind)
        if kind == REFSXP:
            index = flags >> 8
            if index == 0:
                index = self.int32()
            return self.references[index - 1]
        if kind in (NAMESPACESXP, PACKAGESXP):
            if self.int32() != 0:
                raise ValueError("bad namespace specification in R data")
            names = [self.item() for _ in range(self.int32())]
            value = ("namespace", tuple(names))
            self.references.append(value)
            return value
        if kind == SYMSXP:
            symbol = RSymbol(self.item() or "")
            self.references.append(symbol)
            return symbol
        if kind == ENVSXP:
            self.int32()  # locked
            env = {}
            self.references.append(env)
            env["enclosure"] = self.item()
            env["frame"] = self.item()
            env["hashtab"] = self.item()
            env["attributes"] = self.item()
            return env
        if kind in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP, ATTRLANGSXP, ATTRLISTSXP):
            # a pairlist: returned as a list of (tag, value), read iteratively along the CDR chain
            cells = []
            while True:
                if has_attributes:
                    self.item()
                tag = self.item() if has_tag else None
                cells.append((tag, self.item()))
                flags = self.int32()
                kind = flags & 0xFF
                if kind not in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP, ATTRLANGSXP, ATTRLISTSXP):
                    self.pos -= 4
                    tail = self.item()
                    if tail is not None:
                        cells.append((None, tail))
                    return cells
                has_attributes = bool(flags & (1 << 9))
                has_tag = bool(flags & (1 << 10))
        if kind == CHARSXP:
            return self.charsxp(levels)
        if kind in (LGLSXP, INTSXP):
            n = self.length()
            values = struct.unpack(f">{n}i", self.take(4 * n))
            values = [None if v == NA_INTEGER else (bool(v) if kind == LGLSXP else v) for v in values]
            return RVector(values, self.attributes(has_attributes))
        if kind == REALSXP:
            n = self.length()
            return RVector(struct.unpack(f">{n}d", self.take(8 * n)), self.attributes(has_attributes))
        if kind == CPLXSXP:
            n = self.length()
            parts = struct.unpack(f">{2 * n}d", self.take(16 * n))
            return RVector([complex(parts[2 * i], parts[2 * i + 1]) for i in range(n)],
                           self.attributes(has_attributes))
        if kind == RAWSXP:
            n = self.length()
            return RVector(self.take(n), self.attributes(has_attributes))
        if kind == STRSXP:
            n = self.length()
            strings = []
            for _ in range(n):
                element_flags = self.int32()
                if element_flags & 0xFF != CHARSXP:
                    raise ValueError("character vector element is not a string")
                strings.append(self.charsxp(element_flags >> 12))
            return RVector(strings, self.attributes(has_attributes))
        if kind in (VECSXP, EXPRSXP):
            n = self.length()
            items = [self.item() for _ in range(n)]
            return RVector(items, self.attributes(has_attributes))
        if kind == S4SXP:
            return RVector([], self.attributes(has_attributes))
        if kind == ALTREP_SXP:
            return self.altrep()
        raise ValueError(f"R data holds an object of type {kind}, which this reader does not support")

    def altrep(self):
        info = self.item()  # pairlist: class symbol, package symbol, base type
        state = self.item()
        attributes = self.item()
        class_name = str(info[0][1]) if info else "?"
        if class_name == "compact_intseq":
            n, start, step = (int(x) for x in state)
            return RVector([start + i * step for i in range(n)])
        if class_name == "compact_realseq":
            n, start, step = state
            return RVector([start + i * step for i in range(int(n))])
        if class_name.startswith("wrap_"):
            return state[0]  # state = list(wrapped vector, metadata)
        if class_name == "deferred_string":
            values = state[0][1] if isinstance(state, list) and isinstance(state[0], tuple) else state
            return RVector([str(v) for v in values])
        raise ValueError(f"R data holds an ALTREP object of class {class_name}, not supported")


def unserialize(data):
    """Reads one XDR-serialized R object from bytes."""
    reader = _Reader(data)
    reader.header()
    return reader.item()


def _named_list(vector):
    names = vector.attributes.get(RSymbol("names")) or vector.attributes.get("names")
    return dict(zip(names, vector))


def read_lazyload_db(rdx_path, rdb_path):
    """Returns {name: object} for every variable of an R lazy-load data base (.rdx index + .rdb objects)."""
    with gzip.open(rdx_path, "rb") as f:
        index = _named_list(unserialize(f.read()))
    compression = index.get("compressed")
    compression = compression[0] if compression else True
    decompress = {True: zlib.decompress, 1: zlib.decompress, 2: bz2.decompress, 3: lzma.decompress}.get(compression)
    if decompress is None:
        raise ValueError(f"{rdb_path}: unknown compression {compression!r}")
    objects = {}
    with open(rdb_path, "rb") as f:
        rdb = f.read()
    for name, (offset, length) in _named_list(index["variables"]).items():
        blob = rdb[int(offset):int(offset) + int(length)]
        expected = struct.unpack(">I", blob[:4])[0]
        data = decompress(blob[5:] if compression in (2, 3) else blob[4:])
        if len(data) != expected:
            raise ValueError(f"{rdb_path}: object {name} decompresses to {len(data)} bytes, expected {expected}")
        objects[name] = unserialize(data)
    return objects
