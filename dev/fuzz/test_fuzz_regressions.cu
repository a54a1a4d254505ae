/*
Replays pinned inputs through the readers the fuzzer runs (dev/fuzz/fuzz_readers.h), built with g++ so
that make test needs no clang:
    dev/fuzz/regressions/<reader>/<name>          an input that once crashed, hung or allocated without
                                                  bound, or a hand-made malformed one
    dev/fuzz/regressions/<reader>/<name>.expect   one line: a piece of the error line the reader must stop
                                                  with, or "no error" when it must accept the input
    dev/fuzz/seeds/<reader>/<name>                the fuzzer's seeds: valid files, every one accepted
Each input runs in a child process, so a crash or a hang fails that case alone: it must finish within
10 seconds, without a signal, and stop (or not) as expected, the error on one line starting "error: ".
    build/test_fuzz_regressions [DIRECTORY_WITH_regressions_AND_seeds]   (default dev/fuzz)
Prints `N passed, M failed` and exits non-zero on any failure.
*/
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "fuzz_readers.h"

static constexpr const char* kNoError = "no error";
static constexpr unsigned kSecondsPerCase = 10;

static int passed = 0, failed = 0;

// Sorted names in a directory ({} when it does not exist).
static std::vector<std::string> names_in(const std::string& directory) {
    std::vector<std::string> names;
    DIR* dir = opendir(directory.c_str());
    if (!dir) return names;
    while (struct dirent* entry = readdir(dir)) {
        if (entry->d_name[0] != '.') names.push_back(entry->d_name);
    }
    closedir(dir);
    std::sort(names.begin(), names.end());
    return names;
}

static std::vector<uint8_t> read_bytes(const std::string& path) {
    std::vector<uint8_t> bytes(file_size(path));
    FILE* file = open_file(path, "rb");
    if (!bytes.empty()) read_exact(bytes.data(), 1, bytes.size(), file, path, "the input");
    close_file(file, path);
    return bytes;
}

static bool ends_with(const std::string& text, const std::string& suffix) {
    return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Runs the reader on the input in a child; "" when the child ended normally (*message: its error line,
// "" when the input was accepted), else what went wrong (a signal, a hang).
static std::string replay_in_child(const FuzzedReader& reader, const std::vector<uint8_t>& input, std::string* message) {
    int channel[2];
    if (pipe(channel) != 0) return std::string("pipe: ") + strerror(errno);
    fflush(stdout);
    fflush(stderr);
    pid_t child = fork();
    if (child < 0) return std::string("fork: ") + strerror(errno);
    if (child == 0) {
        close(channel[0]);
        alarm(kSecondsPerCase);
        const std::string error = run_fuzzed_reader(reader, input.data(), input.size());
        for (size_t sent = 0; sent < error.size();) {
            ssize_t count = write(channel[1], error.data() + sent, error.size() - sent);
            if (count <= 0) _exit(3);
            sent += (size_t)count;
        }
        _exit(0);
    }
    close(channel[1]);
    message->clear();
    char buffer[4096];
    ssize_t count;
    while ((count = read(channel[0], buffer, sizeof(buffer))) > 0) message->append(buffer, (size_t)count);
    close(channel[0]);
    int status = 0;
    if (waitpid(child, &status, 0) != child) return std::string("waitpid: ") + strerror(errno);
    if (WIFSIGNALED(status)) {
        if (WTERMSIG(status) == SIGALRM) return "still running after " + std::to_string(kSecondsPerCase) + " s";
        return std::string("crashed: ") + strsignal(WTERMSIG(status));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return "the child exited with status " + std::to_string(WEXITSTATUS(status));
    return "";
}

// A message as the log shows it: control and non-ASCII bytes escaped, at most 200 characters.
static std::string shown(const std::string& text) {
    std::string out;
    for (unsigned char byte : text.substr(0, 200)) {
        if (byte >= 0x20 && byte < 0x7F) out += (char)byte;
        else TextAssembler::append_escaped(out, byte);
    }
    return text.size() > 200 ? out + " ..." : out;
}

static void check_case(const FuzzedReader& reader, const std::string& input_path, const std::string& expected) {
    const std::string label = std::string(reader.name) + "/" + input_path.substr(input_path.find_last_of('/') + 1);
    std::string message;
    std::string problem = replay_in_child(reader, read_bytes(input_path), &message);
    if (problem.empty()) {
        if (expected == kNoError) {
            if (!message.empty()) problem = "expected no error, got: " + shown(message);
        } else if (message.empty()) {
            problem = "accepted, expected an error containing '" + expected + "'";
        } else if (message.rfind("error: ", 0) != 0 || message.find('\n') != std::string::npos) {
            problem = "the error is not one line starting 'error: ': " + shown(message);
        } else if (message.find(expected) == std::string::npos) {
            problem = "the error does not contain '" + expected + "': " + shown(message);
        }
    }
    if (problem.empty()) {
        passed++;
        printf("  ok    %-44s %s\n", label.c_str(), message.empty() ? "(accepted)" : shown(message).c_str());
    } else {
        failed++;
        printf("  FAIL  %-44s %s\n", label.c_str(), problem.c_str());
    }
}

static void fail(const std::string& problem) {
    failed++;
    printf("  FAIL  %s\n", problem.c_str());
}

// The expected text: the first line of the .expect file, without trailing white space.
static std::string expected_text(const std::string& path) {
    const std::vector<uint8_t> bytes = read_bytes(path);
    std::string text(bytes.begin(), std::find(bytes.begin(), bytes.end(), (uint8_t)'\n'));
    while (!text.empty() && (text.back() == ' ' || text.back() == '\r' || text.back() == '\t')) text.pop_back();
    return text;
}

int main(int argc, char** argv) {
    const std::string root = argc > 1 ? argv[1] : "dev/fuzz";
    try {  // fatal() throws in this build (-DLLMC_FUZZ): a broken case file fails the suite with its line
        for (const FuzzedReader& reader : fuzzed_readers()) {
            printf("%s\n", reader.name);
            const std::string regressions = root + "/regressions/" + reader.name;
            const std::vector<std::string> names = names_in(regressions);
            int cases = 0;
            for (const std::string& name : names) {
                if (ends_with(name, ".expect")) {
                    const std::string input = name.substr(0, name.size() - 7);
                    if (!std::binary_search(names.begin(), names.end(), input))
                        fail(regressions + "/" + name + " has no input file " + input);
                    continue;
                }
                if (!std::binary_search(names.begin(), names.end(), name + ".expect")) {
                    fail(regressions + "/" + name + " has no .expect file");
                    continue;
                }
                const std::string expected = expected_text(regressions + "/" + name + ".expect");
                if (expected.empty()) {
                    fail(regressions + "/" + name + ".expect is empty (write a piece of the error, or '" +
                         kNoError + "')");
                    continue;
                }
                check_case(reader, regressions + "/" + name, expected);
                cases++;
            }
            // so that a missing or misnamed folder cannot pass by checking nothing
            if (cases == 0) fail(regressions + " holds no cases");
            const std::string seeds = root + "/seeds/" + reader.name;
            int seed_count = 0;
            for (const std::string& name : names_in(seeds)) {
                check_case(reader, seeds + "/" + name, kNoError);
                seed_count++;
            }
            if (seed_count == 0) fail(seeds + " holds no seeds");
        }
        for (const std::string& name : names_in(root + "/regressions"))
            if (!find_fuzzed_reader(name)) fail(root + "/regressions/" + name + " is not the name of a reader");
    } catch (const FatalError& error) {
        fail(error.message);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
