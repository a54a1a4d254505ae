/*
The libFuzzer entry point for one reader of dev/fuzz/fuzz_readers.h (which says what each reader runs
and how to fuzz them all), chosen when compiling: scripts/fuzz.sh builds it once per reader as
    clang++ -fsanitize=fuzzer,address,undefined -DLLMC_CPU -DLLMC_FUZZ -DFUZZ_READER='"model"' ...
*/
#include "fuzz_readers.h"

#ifndef FUZZ_READER
#error "compile with -DFUZZ_READER='\"<reader>\"': model, shard, tokenizer, checkpoint or flags"
#endif

static const FuzzedReader& fuzzed_reader() {
    static const FuzzedReader* reader = find_fuzzed_reader(FUZZ_READER);
    if (!reader) fuzz_finding("no reader named %s in fuzz_readers.h", FUZZ_READER);
    return *reader;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    run_fuzzed_reader(fuzzed_reader(), data, size);
    return 0;
}

// libFuzzer's own mutation, then the reader's repair on every other mutant, so that the checks a repair
// satisfies (checksums) still see broken inputs half the time
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
    size = LLVMFuzzerMutate(data, size, max_size);
    if (fuzzed_reader().repair && seed % 2 == 0) fuzzed_reader().repair(data, size);
    return size;
}
