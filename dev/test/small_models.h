/*
The model shape the unit tests build: GPT-2's block at 64 channels and 4 heads, a vocabulary of 100 padded to
128 (so that padding is exercised), small enough that a test allocates it many times over.
*/
#pragma once

#include "../../llmc/model/parameters.h"

inline GPT2Config small_gpt2(int layers, int max_seq_len = 24) {
    GPT2Config c;
    c.max_seq_len = max_seq_len;
    c.vocab_size = 100;
    c.padded_vocab_size = 128;
    c.num_layers = layers;
    c.num_heads = 4;
    c.channels = 64;
    return gpt2_shape(c);
}
