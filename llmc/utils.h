/*
Host-side helpers shared by the whole program: the one way to stop with an error, and file I/O that
checks every call. Bad input must end in a single line that names the problem and a non-zero exit,
never a crash or a silently wrong answer; these helpers make that the easy path.
*/
#pragma once

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <string>
#include <vector>
#include <sys/stat.h>

#ifdef LLMC_FUZZ
#include <set>
// Fuzz builds only (dev/fuzz/): what fatal() throws instead of exiting, the whole "error: ..." line.
struct FatalError {
    std::string message;
};
// Files open_file() opened and close_file() has not closed yet: when fatal() throws out of a reader that
// holds one, the fuzz harness closes it, or every bad input would leak a descriptor.
inline std::set<FILE*>& fuzz_files_left_open() {
    static std::set<FILE*> files;
    return files;
}
#endif

// Prints "error: <message>" on one line and exits with status 1.
[[noreturn]] __attribute__((format(printf, 1, 2))) inline void fatal(const char* format, ...) {
    fflush(stdout);
    // one write of the whole line: several ranks stopping at once must not interleave their lines
    char line[4096];
    va_list args;
    va_start(args, format);
    const int length = vsnprintf(line, sizeof(line), format, args);
    va_end(args);
#ifdef LLMC_FUZZ
    // a fuzzer feeds thousands of inputs to one process: a bad input must end its own run, not the process
    throw FatalError{std::string("error: ") + line + (length >= (int)sizeof(line) ? " ..." : "")};
#endif
    fprintf(stderr, "error: %s%s\n", line, length >= (int)sizeof(line) ? " ..." : "");
    fflush(stderr);
    exit(EXIT_FAILURE);
}

inline FILE* open_file(const std::string& path, const char* mode) {
    FILE* file = fopen(path.c_str(), mode);
    if (!file) fatal("cannot open %s: %s", path.c_str(), strerror(errno));
#ifdef LLMC_FUZZ
    fuzz_files_left_open().insert(file);
#endif
    return file;
}

// Reads exactly `count` elements or stops, naming the file and what was expected there.
inline void read_exact(void* buffer, size_t element_size, size_t count, FILE* file, const std::string& path,
                       const char* what) {
    size_t got = fread(buffer, element_size, count, file);
    if (got != count) {
        fatal("%s is truncated: expected %zu bytes of %s, found %zu", path.c_str(), element_size * count, what,
              element_size * got);
    }
}

inline void write_exact(const void* buffer, size_t element_size, size_t count, FILE* file, const std::string& path) {
    if (fwrite(buffer, element_size, count, file) != count) fatal("cannot write %s: %s", path.c_str(), strerror(errno));
}

inline void close_file(FILE* file, const std::string& path) {
#ifdef LLMC_FUZZ
    fuzz_files_left_open().erase(file);
#endif
    if (fclose(file) != 0) fatal("cannot close %s: %s", path.c_str(), strerror(errno));
}

// Writes `text` to `path` (replacing it), stopping with one line if that fails.
inline void write_text_file(const std::string& path, const std::string& text) {
    FILE* file = open_file(path, "w");
    write_exact(text.data(), 1, text.size(), file, path);
    close_file(file, path);
}

inline bool file_exists(const std::string& path) {
    struct stat info;
    return stat(path.c_str(), &info) == 0;
}

inline size_t file_size(const std::string& path) {
    struct stat info;
    if (stat(path.c_str(), &info) != 0) fatal("cannot open %s: %s", path.c_str(), strerror(errno));
    return (size_t)info.st_size;
}

// A number as a person writes it: the fewest significant digits that read back as the same float or double
// (0.01f as 0.01, not 0.00999999978), whole numbers below whole_below in full (500000, not 5e+05), an exponent
// without its sign's + and leading zeros (1e-8). The flags' JSON and the machine profile's text use it.
template <typename Real>
inline std::string shortest_number_text(Real value, double whole_below) {
    char text[64];
    if (value == std::floor(value) && std::fabs((double)value) < whole_below) {
        snprintf(text, sizeof(text), "%.0f", (double)value);
        return text;
    }
    constexpr int most_digits = sizeof(Real) == sizeof(float) ? 9 : 17;  // always enough to read back the same
    for (int digits = 1; digits <= most_digits; digits++) {
        snprintf(text, sizeof(text), "%.*g", digits, (double)value);
        const Real back = sizeof(Real) == sizeof(float) ? (Real)strtof(text, nullptr) : (Real)strtod(text, nullptr);
        if (back == value) break;
    }
    std::string number = text;
    const size_t e = number.find('e');
    if (e == std::string::npos) return number;
    size_t digits = e + 1;
    if (number[digits] == '+') number.erase(digits, 1);
    else if (number[digits] == '-') digits++;
    while (digits + 1 < number.size() && number[digits] == '0') number.erase(digits, 1);
    return number;
}

// "a,b,,c" -> {"a", "b", "", "c"}; "" -> {}
inline std::vector<std::string> split_string(const std::string& text, char separator) {
    std::vector<std::string> parts;
    if (text.empty()) return parts;
    size_t start = 0;
    while (true) {
        const size_t end = text.find(separator, start);
        parts.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
        if (end == std::string::npos) return parts;
        start = end + 1;
    }
}
