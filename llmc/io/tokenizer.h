/*
Turns token ids back into text, from the tokenizer file written by data/prepare.py.

File format (little-endian):
  header int32[256]: [0] = 20240328 magic, [1] = 2 version, [2] = vocabulary size V, [3] = end-of-text id
  then for each token id 0..V-1 in order: uint8 length L (1..255) followed by the token's L raw bytes.

A GPT-2 token is a byte string, not necessarily whole characters: an emoji or a CJK character is often
split over two or three tokens, each of which alone is invalid UTF-8. So text shown while sampling goes
through a TextAssembler, which holds back the start of a character until its last byte arrives, and
shows bytes that can never become a valid character (and control characters other than newline and
tab) as \xNN escapes, so the terminal never receives broken or control sequences.

    Tokenizer tokenizer;
    tokenizer_init(&tokenizer, "data/gpt2_tokenizer.bin");   // fatal() with one line on a bad file
    const std::string& bytes = tokenizer_decode(&tokenizer, id);   // raw bytes of one token
    std::string shown = tokenizer_printable(&tokenizer, ids, count);
*/
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../utils.h"

constexpr int TOKENIZER_MAGIC = 20240328;
constexpr int TOKENIZER_VERSION = 2;

struct Tokenizer {
    uint32_t vocab_size = 0;
    uint32_t end_of_text = 0;
    std::vector<std::string> tokens;  // raw bytes of each token id
};

inline void tokenizer_init(Tokenizer* tokenizer, const std::string& path) {
    FILE* file = open_file(path, "rb");
    int32_t header[256];
    read_exact(header, sizeof(int32_t), 256, file, path, "header");
    if (header[0] != TOKENIZER_MAGIC) {
        fatal("%s is not a tokenizer file (magic %d, expected %d)", path.c_str(), header[0], TOKENIZER_MAGIC);
    }
    if (header[1] != TOKENIZER_VERSION) {
        fatal("%s has tokenizer version %d; only version %d is supported", path.c_str(), header[1],
              TOKENIZER_VERSION);
    }
    int32_t vocab_size = header[2], end_of_text = header[3];
    if (vocab_size <= 0 || vocab_size > (1 << 24)) {
        fatal("%s has an invalid vocabulary size %d", path.c_str(), vocab_size);
    }
    if (end_of_text < 0 || end_of_text >= vocab_size) {
        fatal("%s has end-of-text id %d outside its vocabulary of %d", path.c_str(), end_of_text, vocab_size);
    }
    // each token takes at least 2 bytes (its length and one byte): a header claiming more tokens than the
    // file can hold is refused before a string is allocated for every id it claims
    const size_t total = file_size(path), room = total > sizeof(header) ? total - sizeof(header) : 0;
    if ((size_t)vocab_size > room / 2) {
        fatal("%s has room for at most %zu tokens after its header, but claims a vocabulary of %d", path.c_str(),
              room / 2, vocab_size);
    }
    tokenizer->vocab_size = (uint32_t)vocab_size;
    tokenizer->end_of_text = (uint32_t)end_of_text;
    tokenizer->tokens.assign(vocab_size, std::string());
    for (int32_t id = 0; id < vocab_size; id++) {
        uint8_t length;
        read_exact(&length, 1, 1, file, path, "a token length");
        if (length == 0) fatal("%s: token %d has length 0", path.c_str(), id);
        std::string& token = tokenizer->tokens[id];
        token.resize(length);
        read_exact(&token[0], 1, length, file, path, "token bytes");
    }
    long end_of_tokens = ftell(file);
    if (end_of_tokens < 0 || (size_t)end_of_tokens != total) {
        fatal("%s has %zu bytes after its %d tokens", path.c_str(), total - (size_t)end_of_tokens, vocab_size);
    }
    close_file(file, path);
}

// The raw bytes of one token (possibly a partial UTF-8 character; see TextAssembler for display).
inline const std::string& tokenizer_decode(const Tokenizer* tokenizer, uint32_t token) {
    if (token >= tokenizer->vocab_size) {
        fatal("token id %u is outside the tokenizer's vocabulary of %u", token, tokenizer->vocab_size);
    }
    return tokenizer->tokens[token];
}

inline void tokenizer_free(Tokenizer* tokenizer) {
    tokenizer->tokens.clear();
    tokenizer->tokens.shrink_to_fit();
    tokenizer->vocab_size = 0;
}

// Length of the UTF-8 sequence that `bytes` (count available) starts: 1..4 when complete and valid,
// 0 when it is a valid beginning that needs more bytes, -1 when it can never be valid (stray
// continuation byte, overlong form, surrogate, above U+10FFFF).
inline int utf8_sequence_length(const unsigned char* bytes, size_t count) {
    unsigned char lead = bytes[0];
    int length;
    unsigned char low = 0x80, high = 0xBF;  // allowed range of the second byte
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) {
        length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
        length = 3;
        if (lead == 0xE0) low = 0xA0;   // below: overlong
        if (lead == 0xED) high = 0x9F;  // above: UTF-16 surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        length = 4;
        if (lead == 0xF0) low = 0x90;   // below: overlong
        if (lead == 0xF4) high = 0x8F;  // above: beyond U+10FFFF
    } else {
        return -1;
    }
    for (int i = 1; i < length; i++) {
        if ((size_t)i >= count) return 0;
        unsigned char lo = i == 1 ? low : 0x80, hi = i == 1 ? high : 0xBF;
        if (bytes[i] < lo || bytes[i] > hi) return -1;
    }
    return length;
}

// Collects token bytes and hands back text that is safe to print: see the comment at the top.
struct TextAssembler {
    std::string pending;  // the start of a character whose remaining bytes have not arrived yet

    std::string push(const std::string& bytes) {
        pending += bytes;
        std::string shown;
        size_t i = 0;
        while (i < pending.size()) {
            const unsigned char* at = (const unsigned char*)pending.data() + i;
            int length = utf8_sequence_length(at, pending.size() - i);
            if (length == 0) break;  // wait for the rest of this character
            if (length < 0) {
                append_escaped(shown, at[0]);
                i += 1;
            } else if (length == 1 && at[0] < 0x20 && at[0] != '\n' && at[0] != '\t') {
                append_escaped(shown, at[0]);
                i += 1;
            } else if (length == 1 && at[0] == 0x7F) {
                append_escaped(shown, at[0]);
                i += 1;
            } else {
                shown.append((const char*)at, length);
                i += length;
            }
        }
        pending.erase(0, i);
        return shown;
    }

    // Text ends: an unfinished character is shown escaped.
    std::string finish() {
        std::string shown;
        for (unsigned char byte : pending) append_escaped(shown, byte);
        pending.clear();
        return shown;
    }

    static void append_escaped(std::string& out, unsigned char byte) {
        static const char digits[] = "0123456789abcdef";
        out += "\\x";
        out += digits[byte >> 4];
        out += digits[byte & 15];
    }
};

// Printable text of a whole sequence of token ids.
inline std::string tokenizer_printable(const Tokenizer* tokenizer, const int* ids, size_t count) {
    TextAssembler assembler;
    std::string shown;
    for (size_t i = 0; i < count; i++) shown += assembler.push(tokenizer_decode(tokenizer, (uint32_t)ids[i]));
    return shown + assembler.finish();
}
